"""ListGroups and DescribeGroups of the Kafka listener (docs/kafka.md, "Consumer
groups"): what the coordinator holds in memory, and the groups it only has a generation
for in ZooKeeper (Empty), filtered by Describe on each group."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from kazoo.exceptions import KazooException
from kio.schema.errors import ErrorCode

from broker.common.acls import Operation
from broker.common.kafka.apis import ApiKey
from broker.server.auth.rules import RequestRules
from broker.server.auth.session import Session
from broker.server.kafka.coordinator import GroupCoordinator
from broker.server.kafka.groupstate import GroupState
from broker.server.kafka.messages import entity, field, response
from broker.server.kafka.offsetrequests import NO_THROTTLE

# Kafka's AclOperation codes, for DescribeGroups' authorized_operations bit field
ACL_OPERATION_CODES = {Operation.READ: 3, Operation.DESCRIBE: 8}
NOT_ASKED = -2147483648
Refusal = Callable[[str, Session, Operation], Awaitable[ErrorCode | None]]


class GroupListing:
    def __init__(self, coordinator: GroupCoordinator, rules: RequestRules) -> None:
        self.coordinator = coordinator
        self.rules = rules

    async def list_groups(self, request: Any, version: int, session: Session) -> Any:
        """The groups this broker coordinates (none elsewhere: admin clients ask every
        broker), those the principal may describe, in the states asked for."""
        states = {s.lower() for s in field(request, "states_filter", ())}
        listed = []
        if (await self.coordinator.role()).epoch_version is not None:
            stored = await self.coordinator.store.call(self.coordinator.store.kafka_groups)
            for group_id in sorted(set(stored) | set(self.coordinator.groups)):
                group = self.coordinator.known(group_id)
                state = group.state.value if group else GroupState.EMPTY.value
                if (states and state.lower() not in states) or not self.rules.may_group(session, Operation.DESCRIBE,
                                                                                        group_id):
                    continue
                protocol_type = group.protocol_type if group else await self._stored_type(group_id)
                listed.append(entity(ApiKey.LIST_GROUPS, version, "ListedGroup", group_id=group_id,
                                     protocol_type=protocol_type, group_state=state))
        return response(ApiKey.LIST_GROUPS, version, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                        groups=tuple(listed))

    async def _stored_type(self, group_id: str) -> str:
        stored = await self.coordinator.store.call(self.coordinator.store.read_group, group_id)
        return stored.protocol_type if stored else ""

    async def describe_groups(self, request: Any, version: int, session: Session, refusal: Refusal) -> Any:
        """Each group asked for: Describe on it, and this broker its coordinator."""
        asked = field(request, "include_authorized_operations", False)
        described = [await self._describe(group_id, version, session, asked, await refusal(group_id, session,
                                                                                           Operation.DESCRIBE))
                     for group_id in request.groups]
        return response(ApiKey.DESCRIBE_GROUPS, version, throttle_time=NO_THROTTLE, groups=tuple(described))

    async def _describe(self, group_id: str, version: int, session: Session, operations_asked: bool,
                        refusal: ErrorCode | None) -> Any:
        group = self.coordinator.known(group_id) if refusal is None else None
        state = group.state if group else GroupState.DEAD
        if group is None and refusal is None:
            try:
                stored = await self.coordinator.store.call(self.coordinator.store.read_group, group_id)
                state = GroupState.EMPTY if stored else GroupState.DEAD
            except (KazooException, OSError):
                refusal = ErrorCode.coordinator_not_available
        stable = state == GroupState.STABLE
        members = tuple(
            entity(ApiKey.DESCRIBE_GROUPS, version, "DescribedGroupMember", member_id=m.member_id,
                   group_instance_id=None, client_id="", client_host=m.client_host,
                   member_metadata=m.metadata(group.protocol) if stable else b"",
                   member_assignment=m.assignment if stable else b"")
            for m in (group.members.values() if group else ()))
        operations = NOT_ASKED
        if operations_asked and refusal is None:
            operations = sum(1 << code for op, code in ACL_OPERATION_CODES.items()
                             if self.rules.may_group(session, op, group_id))
        return entity(ApiKey.DESCRIBE_GROUPS, version, "DescribedGroup", error_code=refusal or ErrorCode.none,
                      group_id=group_id, group_state=state.value,
                      protocol_type=group.protocol_type if group else "",
                      protocol_data=(group.protocol or "") if stable else "", members=members,
                      authorized_operations=operations)
