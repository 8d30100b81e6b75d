"""The Kafka group coordinator (docs/kafka.md, "Consumer groups"): the groups this broker
coordinates while it is the active controller, their joins, syncs, heartbeats and
leaves, session expiry, and the generation and member checks of offset commits.

Everything runs in the listener's event loop; the ZooKeeper work (`GroupStore`) runs in
threads. The group transitions are `broker.server.kafka.groupstate`'s. A new generation
is persisted before any member hears of it, so generations keep increasing across a
change of coordinator, and a member of a generation the new coordinator never made
cannot commit. When the coordinator role changes hands (the `/controller_epoch` version
it holds is not the current one), every group is dropped: its waiting requests are
answered NOT_COORDINATOR and the members find the new coordinator and rejoin.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from kazoo.recipe.watchers import DataWatch
from kio.schema.errors import ErrorCode

from broker.common.zklayout import CONTROLLER, CONTROLLER_EPOCH
from broker.server.kafka.groupstate import Group, GroupState, JoinAnswer, Member, SyncAnswer
from broker.server.kafka.groupstore import CoordinatorEpoch, CoordinatorFenced, GroupStore, StoredGroup

logger = logging.getLogger(__name__)

TICK_S = 0.1  # how often sessions and rebalance deadlines are checked


@dataclass(frozen=True)
class GroupSettings:
    """Kafka's broker settings of the same names (milliseconds there, seconds here)."""

    min_session_timeout: float = 6.0  # group.min.session.timeout.ms
    max_session_timeout: float = 1800.0  # group.max.session.timeout.ms
    initial_rebalance_delay: float = 3.0  # group.initial.rebalance.delay.ms
    zookeeper_timeout: float = 6.0  # the longest wait for ZooKeeper: zookeeper.session.timeout.ms

    @classmethod
    def from_config(cls, config: Any) -> "GroupSettings":
        return cls(config.group_min_session_timeout_ms / 1000, config.group_max_session_timeout_ms / 1000,
                   config.group_initial_rebalance_delay_ms / 1000, config.zookeeper_session_timeout_ms / 1000)


@dataclass(frozen=True)
class JoinRequest:
    group_id: str
    member_id: str
    session_timeout: float
    rebalance_timeout: float
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    client_host: str
    member_id_required: bool  # JoinGroup v4+: a first join gets MEMBER_ID_REQUIRED and a member id (KIP-394)


class RoleWatch:
    """The coordinator role as last read, read again after `/controller` or
    `/controller_epoch` changed (kazoo's watches flag it) or a write found it moved."""

    def __init__(self, store: GroupStore) -> None:
        self.store = store
        self._role = CoordinatorEpoch(None)
        self._stale = True
        self._reading: asyncio.Future | None = None

    def watch(self) -> None:
        for path in (CONTROLLER, CONTROLLER_EPOCH):
            DataWatch(self.store.zk, path, self._on_change)

    def _on_change(self, data: bytes | None, stat: object) -> None:
        self._stale = True  # kazoo's thread: only a flag

    def stale(self) -> None:
        self._stale = True

    async def current(self) -> CoordinatorEpoch:
        """The role; requests arriving during a read wait for that read."""
        if self._stale and self._reading is None:
            self._stale = False  # a change while we read sets it again
            self._reading = asyncio.ensure_future(self.store.call(self.store.coordinator))
        if self._reading is not None:
            reading = self._reading
            try:
                self._role = await asyncio.shield(reading)
            except Exception:
                self._stale = True
                raise
            finally:
                if self._reading is reading:
                    self._reading = None
        return self._role


class GroupCoordinator:
    def __init__(self, store: GroupStore, settings: GroupSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.groups: dict[str, Group] = {}
        self.epoch_version: int | None = None  # the /controller_epoch version the groups were loaded under
        self.roles = RoleWatch(store)

    async def role(self) -> CoordinatorEpoch:
        """Who coordinates; groups held under another epoch are dropped."""
        role = await self.roles.current()
        self.take_role(role.epoch_version)
        return role

    def take_role(self, epoch_version: int | None) -> None:
        """The coordinator role as just read: a different epoch (or none) drops every group."""
        if epoch_version == self.epoch_version:
            return
        if self.groups:
            logger.info("group coordinator: the controller epoch moved (%s -> %s); dropping %d groups",
                        self.epoch_version, epoch_version, len(self.groups))
        self.drop_all()
        self.epoch_version = epoch_version

    def drop_all(self) -> None:
        now = self.clock()
        for group in self.groups.values():
            group.abandon(ErrorCode.not_coordinator, now)
        self.groups = {}
        self.epoch_version = None

    async def group(self, group_id: str) -> Group:
        """The group, loaded with its last generation from ZooKeeper on first use."""
        if group_id not in self.groups:
            stored = await self.store.call(self.store.read_group, group_id)
            if group_id not in self.groups:  # another request may have loaded it meanwhile
                self.groups[group_id] = Group(group_id, stored.generation if stored else 0,
                                              stored.protocol_type if stored else "")
        return self.groups[group_id]

    def known(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

    # -------------------------------------------------------------- requests

    async def join(self, request: JoinRequest) -> JoinAnswer:
        if not self.settings.min_session_timeout <= request.session_timeout <= self.settings.max_session_timeout:
            return JoinAnswer(ErrorCode.invalid_session_timeout, request.member_id)
        group = await self.group(request.group_id)
        now = self.clock()
        if not group.accepts(request.protocol_type, request.protocols, request.member_id):
            return JoinAnswer(ErrorCode.inconsistent_group_protocol, request.member_id)
        member_id = request.member_id
        if not member_id:
            member_id = f"consumer-{uuid.uuid4()}"
            if request.member_id_required:
                group.pending[member_id] = now + request.session_timeout
                return JoinAnswer(ErrorCode.member_id_required, member_id)
        elif member_id not in group.members and member_id not in group.pending:
            return JoinAnswer(ErrorCode.unknown_member_id, member_id)
        group.pending.pop(member_id, None)
        existing = group.members.get(member_id)
        if existing is not None and group.state == GroupState.STABLE and member_id != group.leader \
                and existing.protocols == request.protocols:
            existing.last_heard = now  # nothing changed: the current generation stands
            return group.join_answer(member_id)
        if existing is not None and existing.joining is not None:
            existing.answer_join(JoinAnswer(ErrorCode.rebalance_in_progress, member_id), now)
        member = Member(member_id, request.client_host, request.session_timeout, request.rebalance_timeout,
                        request.protocols, now, existing.assignment if existing else b"")
        member.joining = waiting = asyncio.get_running_loop().create_future()
        if existing is not None:
            member.syncing = existing.syncing
        group.members[member_id] = member
        group.protocol_type = request.protocol_type
        if group.state == GroupState.PREPARING_REBALANCE:
            group.rebalance_deadline = max(group.rebalance_deadline, now + request.rebalance_timeout)
        group.prepare_rebalance(now, self.settings.initial_rebalance_delay)
        self._maybe_complete(group)
        return await waiting

    async def sync(self, group_id: str, generation: int, member_id: str, protocol_type: str | None,
                   protocol: str | None, assignments: dict[str, bytes]) -> SyncAnswer:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group else None
        if group is None or member is None:
            return SyncAnswer(ErrorCode.unknown_member_id)
        if generation != group.generation:
            return SyncAnswer(ErrorCode.illegal_generation)
        if (protocol_type is not None and protocol_type != group.protocol_type) \
                or (protocol is not None and group.protocol is not None and protocol != group.protocol):
            return SyncAnswer(ErrorCode.inconsistent_group_protocol)
        now = self.clock()
        member.last_heard = now
        if group.state == GroupState.PREPARING_REBALANCE:
            return SyncAnswer(ErrorCode.rebalance_in_progress)
        if group.state == GroupState.STABLE:
            return group.sync_answer(member)
        member.syncing = waiting = asyncio.get_running_loop().create_future()
        if member_id == group.leader:
            group.assign(assignments, now)
        return await waiting

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group else None
        if group is None or member is None:
            return ErrorCode.unknown_member_id
        if generation != group.generation:
            return ErrorCode.illegal_generation
        member.last_heard = self.clock()
        if group.state == GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(self, group_id: str, member_ids: list[str]) -> list[ErrorCode]:
        """Each member's answer; the group rebalances without those that left."""
        group = self.groups.get(group_id)
        out = []
        now = self.clock()
        for member_id in member_ids:
            if group is not None and member_id in group.members:
                group.remove(member_id, now, self.settings.initial_rebalance_delay)
                logger.info("group %s: member %s left", group_id, member_id)
                out.append(ErrorCode.none)
            elif group is not None and group.pending.pop(member_id, None) is not None:
                out.append(ErrorCode.none)
            else:
                out.append(ErrorCode.unknown_member_id)
        if group is not None:
            self._maybe_complete(group)
        return out

    def commit_error(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        group = self.groups.get(group_id)
        return group.commit_error(generation, member_id, self.clock()) if group else \
            Group(group_id).commit_error(generation, member_id, self.clock())

    # ---------------------------------------------------------------- timers

    def tick(self) -> None:
        """Expire members whose session lapsed and end rebalances past their deadline."""
        now = self.clock()
        for group in list(self.groups.values()):
            for member_id, lapses in list(group.pending.items()):
                if now > lapses:
                    del group.pending[member_id]
            for member in [m for m in group.members.values() if m.expired(now)]:
                logger.info("group %s: member %s expired (no heartbeat for %.1fs)", group.group_id, member.member_id,
                            member.session_timeout)
                group.remove(member.member_id, now, self.settings.initial_rebalance_delay)
            self._maybe_complete(group)

    def _maybe_complete(self, group: Group) -> None:
        if group.may_complete_join(self.clock()):
            group.completing = True
            asyncio.get_running_loop().create_task(self._complete_join(group))

    async def _complete_join(self, group: Group) -> None:
        """End the rebalance: drop who did not rejoin, persist generation + 1, answer."""
        try:
            group.drop_absent(self.clock(), self.settings.initial_rebalance_delay)
            generation = group.generation + 1
            stored = StoredGroup(generation, group.protocol_type, group.select_protocol() if group.members else "")
            epoch_version = self.epoch_version
            if epoch_version is None:
                raise CoordinatorFenced("not the coordinator")
            await self.store.call(self.store.write_group, group.group_id, stored, epoch_version)
            if self.groups.get(group.group_id) is not group:
                return  # dropped meanwhile: its waiters were answered
            group.new_generation(generation, self.clock())
            logger.info("group %s: generation %d, %s, leader %s, members %s", group.group_id, generation,
                        group.state.value, group.leader, sorted(group.members))
        except CoordinatorFenced as exc:
            logger.warning("group %s: not the coordinator any more (%s)", group.group_id, exc)
            self.drop_all()
            self.roles.stale()
        except Exception:
            logger.exception("group %s: persisting a new generation failed; members will rejoin", group.group_id)
            group.abandon(ErrorCode.coordinator_not_available, self.clock())
            self.groups.pop(group.group_id, None)
        finally:
            group.completing = False
