"""The Kafka consumer-group requests (docs/kafka.md, "Consumer groups"): kio requests
of every served version in, the coordinator (`broker.server.kafka.coordinator`) and
the offsets (`broker.server.kafka.offsetrequests`) asked, kio responses of the same
version out. ACLs as Kafka has them: Read on the group to take part or commit,
Describe to find its coordinator or describe it; Kafka's error codes.

The listener's dispatch calls one `async def <api>(request, version, session)` per API
and sends what it returns; every refusal is an error code in the response, never an
exception or a dropped connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kio.schema.errors import ErrorCode

from broker.common.acls import Operation
from broker.common.errors import AuthorizationFailed
from broker.common.kafka.apis import ApiKey
from broker.server.auth.rules import RequestRules
from broker.server.auth.session import Session
from broker.server.kafka.coordinator import TICK_S, GroupCoordinator, GroupSettings, JoinRequest
from broker.server.kafka.grouplisting import GroupListing
from broker.server.kafka.groupstore import GroupStore
from broker.server.kafka.messages import entity, field, response
from broker.server.kafka.offsetrequests import NO_THROTTLE, OffsetRequests
from broker.server.registration import BrokerRegistry
from broker.server.replies import Reply, later

logger = logging.getLogger(__name__)

FAILURE_LOG_INTERVAL_S = 60.0
ZOOKEEPER_AWAY = (KazooException, OSError)  # a read of the group's nodes failed: COORDINATOR_NOT_AVAILABLE
TRANSACTION_KEY = 1  # FindCoordinator's key_type for transactional ids: logbus has no transactions


class GroupRequests:
    def __init__(self, zk: KazooClient, broker_id: int, registry: BrokerRegistry, rules: RequestRules,
                 settings: GroupSettings) -> None:
        self.registry = registry
        self.rules = rules
        self.coordinator = GroupCoordinator(GroupStore(zk, broker_id, settings.zookeeper_timeout), settings)
        self.offsets = OffsetRequests(self.coordinator, registry, rules)
        self.listing = GroupListing(self.coordinator, rules)
        self._ticker: asyncio.Task | None = None

    def handlers(self) -> dict[int, Callable[[Any, int, Session], Reply]]:
        """The listener's dispatch entries (`KafkaRequests.add`)."""
        methods = {ApiKey.FIND_COORDINATOR: self.find_coordinator, ApiKey.JOIN_GROUP: self.join_group,
                   ApiKey.SYNC_GROUP: self.sync_group, ApiKey.HEARTBEAT: self.heartbeat,
                   ApiKey.LEAVE_GROUP: self.leave_group, ApiKey.OFFSET_COMMIT: self.offset_commit,
                   ApiKey.OFFSET_FETCH: self.offset_fetch, ApiKey.LIST_GROUPS: self.list_groups,
                   ApiKey.DESCRIBE_GROUPS: self.describe_groups}
        return {key: (lambda method: lambda request, version, session: later(method(request, version, session)))(m)
                for key, m in methods.items()}

    async def start(self) -> None:
        """Watch the controller (the coordinator role) and tick sessions; in the event loop."""
        self.coordinator.roles.watch()
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        self.coordinator.drop_all()

    async def _tick(self) -> None:
        """Sessions and rebalance deadlines, and the role read again after a change; a
        failure (ZooKeeper away) is logged once a minute, not every tick."""
        logged = -FAILURE_LOG_INTERVAL_S
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self.coordinator.role()
                self.coordinator.tick()
            except Exception:
                if time.monotonic() - logged >= FAILURE_LOG_INTERVAL_S:
                    logged = time.monotonic()
                    logger.exception("group coordinator: a tick failed (logged once a minute)")

    # ----------------------------------------------------------- coordinator

    async def find_coordinator(self, request: Any, version: int, session: Session) -> Any:
        keys = field(request, "coordinator_keys", None)
        keys = list(keys) if keys is not None and version >= 4 else [request.key]
        key_type = field(request, "key_type", 0)
        found = [await self._coordinator_of(key, key_type, session) for key in keys]
        if version >= 4:
            return response(ApiKey.FIND_COORDINATOR, version, throttle_time=NO_THROTTLE, coordinators=tuple(
                entity(ApiKey.FIND_COORDINATOR, version, "Coordinator", key=key, node_id=node, host=host, port=port,
                       error_code=error, error_message=message)
                for key, (error, message, node, host, port) in zip(keys, found)))
        error, message, node, host, port = found[0]
        return response(ApiKey.FIND_COORDINATOR, version, throttle_time=NO_THROTTLE, error_code=error,
                        error_message=message, node_id=node, host=host, port=port)

    async def _coordinator_of(self, key: str, key_type: int, session: Session) -> tuple:
        """(error, message, node id, host, port): the controller's endpoint on the
        listener the request came in on."""
        if key_type == TRANSACTION_KEY:
            return (ErrorCode.invalid_request, "logbus has no transactions: no transaction coordinator", -1, "", -1)
        if key_type != 0:
            return ErrorCode.invalid_request, f"unknown coordinator key type {key_type}", -1, "", -1
        try:
            self.rules.group(session, Operation.DESCRIBE, key)
        except AuthorizationFailed as exc:
            return ErrorCode.group_authorization_failed, str(exc), -1, "", -1
        try:
            role = await self.coordinator.role()
        except Exception as exc:  # ZooKeeper away: clients retry FindCoordinator
            return ErrorCode.coordinator_not_available, f"cannot read the controller: {exc}", -1, "", -1
        broker = self.registry.view.brokers.get(role.controller) if role.controller is not None else None
        if broker is None:
            return ErrorCode.coordinator_not_available, "no controller (the group coordinator) now", -1, "", -1
        endpoint = next((e for e in broker.endpoints if e.name == session.listener.name), None)
        if endpoint is None:
            return (ErrorCode.coordinator_not_available,
                    f"the coordinator, broker {broker.broker_id}, has no listener {session.listener.name}", -1, "", -1)
        return ErrorCode.none, None, broker.broker_id, endpoint.host, endpoint.port

    async def refusal(self, group_id: str, session: Session, operation: Operation = Operation.READ) -> ErrorCode | None:
        """Why this broker does not handle the group's request, or None: ACL, group id,
        coordinator role (NOT_COORDINATOR sends the client to FindCoordinator)."""
        try:
            self.rules.group(session, operation, group_id)
        except AuthorizationFailed:
            return ErrorCode.group_authorization_failed
        if not group_id:
            return ErrorCode.invalid_group_id
        try:
            role = await self.coordinator.role()
        except Exception as exc:
            logger.debug("group coordinator: reading the controller failed: %s", exc)  # the ticker logs it
            return ErrorCode.coordinator_not_available
        if role.controller is None:
            return ErrorCode.coordinator_not_available
        if role.loading:
            return ErrorCode.coordinator_load_in_progress  # clients retry here
        return None if role.epoch_version is not None else ErrorCode.not_coordinator

    # ------------------------------------------------------------- membership

    async def join_group(self, request: Any, version: int, session: Session) -> Any:
        refusal = await self.refusal(request.group_id, session)
        if refusal is None:
            session_timeout = request.session_timeout.total_seconds()
            rebalance = field(request, "rebalance_timeout", None)
            try:
                answer = await self.coordinator.join(JoinRequest(
                    request.group_id, request.member_id, session_timeout,
                    rebalance.total_seconds() if rebalance is not None and rebalance.total_seconds() >= 0
                    else session_timeout,
                    request.protocol_type, tuple((p.name, bytes(p.metadata)) for p in request.protocols),
                    session.host, version >= 4))
            except ZOOKEEPER_AWAY as exc:  # loading the group's generation
                logger.warning("group %s: cannot load it from ZooKeeper: %s", request.group_id, exc)
                refusal = ErrorCode.coordinator_not_available
        error = refusal if refusal is not None else answer.error
        members = () if refusal is not None else tuple(
            entity(ApiKey.JOIN_GROUP, version, "JoinGroupResponseMember", member_id=m, group_instance_id=None,
                   metadata=metadata) for m, metadata in answer.members)
        ok = refusal is None
        return response(
            ApiKey.JOIN_GROUP, version, throttle_time=NO_THROTTLE, error_code=error,
            generation_id=answer.generation if ok else -1,
            protocol_type=answer.protocol_type if ok else None,
            protocol_name=(answer.protocol if ok else None) or (None if version >= 7 else ""),
            leader=answer.leader if ok else "", skip_assignment=False,
            member_id=answer.member_id if ok else request.member_id, members=members)

    async def sync_group(self, request: Any, version: int, session: Session) -> Any:
        refusal = await self.refusal(request.group_id, session)
        if refusal is not None:
            return response(ApiKey.SYNC_GROUP, version, throttle_time=NO_THROTTLE, error_code=refusal, assignment=b"")
        answer = await self.coordinator.sync(
            request.group_id, request.generation_id, request.member_id, field(request, "protocol_type"),
            field(request, "protocol_name"), {a.member_id: bytes(a.assignment) for a in request.assignments})
        return response(ApiKey.SYNC_GROUP, version, throttle_time=NO_THROTTLE, error_code=answer.error,
                        protocol_type=answer.protocol_type, protocol_name=answer.protocol, assignment=answer.assignment)

    async def heartbeat(self, request: Any, version: int, session: Session) -> Any:
        error = await self.refusal(request.group_id, session)
        if error is None:
            error = self.coordinator.heartbeat(request.group_id, request.generation_id, request.member_id)
        return response(ApiKey.HEARTBEAT, version, throttle_time=NO_THROTTLE, error_code=error)

    async def leave_group(self, request: Any, version: int, session: Session) -> Any:
        identities = list(request.members) if version >= 3 else []
        member_ids = [m.member_id for m in identities] if version >= 3 else [request.member_id]
        refusal = await self.refusal(request.group_id, session)
        errors = [refusal] * len(member_ids) if refusal else self.coordinator.leave(request.group_id, member_ids)
        if version < 3:
            return response(ApiKey.LEAVE_GROUP, version, throttle_time=NO_THROTTLE, error_code=errors[0])
        return response(ApiKey.LEAVE_GROUP, version, throttle_time=NO_THROTTLE, error_code=refusal or ErrorCode.none,
                        members=tuple(entity(ApiKey.LEAVE_GROUP, version, "MemberResponse", member_id=m.member_id,
                                             group_instance_id=m.group_instance_id, error_code=e)
                                      for m, e in zip(identities, errors)) if not refusal else ())

    # ---------------------------------------------------------------- offsets

    async def offset_commit(self, request: Any, version: int, session: Session) -> Any:
        return await self.offsets.commit(request, version, session, await self.refusal(request.group_id, session))

    async def offset_fetch(self, request: Any, version: int, session: Session) -> Any:
        if version >= 8:
            refusals = [await self.refusal(g.group_id, session) for g in request.groups]
        else:
            refusals = [await self.refusal(request.group_id, session)]
        return await self.offsets.fetch(request, version, session, refusals)

    # ------------------------------------------------------------ inspection

    async def list_groups(self, request: Any, version: int, session: Session) -> Any:
        try:
            return await self.listing.list_groups(request, version, session)
        except ZOOKEEPER_AWAY:
            return response(ApiKey.LIST_GROUPS, version, throttle_time=NO_THROTTLE,
                            error_code=ErrorCode.coordinator_not_available, groups=())

    async def describe_groups(self, request: Any, version: int, session: Session) -> Any:
        return await self.listing.describe_groups(request, version, session, self.refusal)
