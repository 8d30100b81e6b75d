"""What the Kafka group coordinator keeps in ZooKeeper (docs/kafka.md, "Consumer
groups"): committed offsets at the very nodes native groups use
(`/consumers/<group>/offsets/<topic>/<partition>`, so the lag sensor, `logbus groups
describe` and the page read Kafka groups unchanged) and each group's generation
(`/consumers/<group>/kafka`), so generations keep increasing across a change of
coordinator.

The coordinator is the active controller. Every write is one ZooKeeper transaction that
also checks `/controller_epoch` is at the version it was when this broker took the
role (`CoordinatorEpoch`): a coordinator deposed meanwhile (a new controller bumps the
epoch) cannot move a group's offsets or generation, whatever its members still send it.

Blocking calls, which the request handlers run with `call`: in a pool of the store's
own, each ZooKeeper wait bounded by `timeout` (kazoo queues a request while ZooKeeper is
away and waits for it without end) — a ZooKeeper outage answers the group requests
COORDINATOR_NOT_AVAILABLE and cannot take the broker's shared executor with it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError, KazooException, NodeExistsError, NoNodeError, RolledBackError, RuntimeInconsistency,
)

from broker.common.zklayout import (
    CONSUMERS, CONTROLLER, CONTROLLER_EPOCH, decode_controller, decode_offset, encode_offset, kafka_group_path,
    offset_path, offsets_path,
)

logger = logging.getLogger(__name__)

NODES_PER_TRANSACTION = 500  # ZooKeeper bounds a request (jute.maxbuffer, 1 MB)

TopicPartition = tuple[str, int]


class ZooKeeperAway(KazooException):
    """A ZooKeeper call did not return within the store's timeout."""


class CoordinatorFenced(Exception):
    """`/controller_epoch` moved on since this broker became the coordinator: another
    broker coordinates now (Kafka's NOT_COORDINATOR)."""


@dataclass(frozen=True)
class StoredGroup:
    """What survives a coordinator: the last generation and what it agreed on."""

    generation: int
    protocol_type: str = ""
    protocol: str = ""

    def encode(self) -> bytes:
        return json.dumps({"generation": self.generation, "protocol_type": self.protocol_type,
                           "protocol": self.protocol}).encode()

    @classmethod
    def decode(cls, data: bytes) -> "StoredGroup":
        node = json.loads(data)
        return cls(int(node["generation"]), str(node.get("protocol_type", "")), str(node.get("protocol", "")))


@dataclass(frozen=True)
class CoordinatorEpoch:
    """Who coordinates: the controller's id (None: no controller), and, when it is this
    broker, the version of `/controller_epoch` its writes check."""

    controller: int | None
    epoch_version: int | None = None
    loading: bool = False  # this broker is the controller, but has not bumped the epoch yet


class GroupStore:
    def __init__(self, zk: KazooClient, broker_id: int, timeout: float = 5.0, threads: int = 4) -> None:
        self.zk = zk
        self.broker_id = broker_id
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="logbus-groups")

    async def call(self, method: Callable[..., Any], *args: Any) -> Any:
        """Run one of the blocking methods below in the store's pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, method, *args)

    def _wait(self, result: Any) -> Any:
        """An asynchronous kazoo call's answer, or ZooKeeperAway after `timeout`."""
        try:
            return result.get(timeout=self.timeout)
        except self.zk.handler.timeout_exception:
            raise ZooKeeperAway(f"no answer from ZooKeeper within {self.timeout:.0f}s") from None

    def coordinator(self) -> CoordinatorEpoch:
        """Read who coordinates. This broker coordinates while `/controller` names it,
        is its own session's node, and `/controller_epoch` was bumped after that node
        was created (its mzxid is later than the node's czxid): until the new
        controller's bump, the version is the predecessor's, which a deposed coordinator
        could still write with; `loading` says so (COORDINATOR_LOAD_IN_PROGRESS)."""
        try:
            data, stat = self._wait(self.zk.get_async(CONTROLLER))
            controller = decode_controller(data)
        except (NoNodeError, ValueError, KeyError, TypeError):
            return CoordinatorEpoch(None)
        if controller != self.broker_id or stat.ephemeralOwner != self.zk.client_id[0]:
            return CoordinatorEpoch(controller)
        try:
            epoch = self._wait(self.zk.get_async(CONTROLLER_EPOCH))[1]
        except NoNodeError:
            return CoordinatorEpoch(controller, loading=True)
        if epoch.mzxid < stat.czxid:
            return CoordinatorEpoch(controller, loading=True)
        return CoordinatorEpoch(controller, epoch.version)

    # ----------------------------------------------------------------- reads

    def read_group(self, group: str) -> StoredGroup | None:
        try:
            data, _ = self._wait(self.zk.get_async(kafka_group_path(group)))
        except NoNodeError:
            return None
        try:
            return StoredGroup.decode(data)
        except (ValueError, KeyError, TypeError):
            logger.error("ignoring unreadable Kafka group node of %s: %r", group, data[:200])
            return None

    def kafka_groups(self) -> list[str]:
        """Groups the Kafka coordinator has kept a generation for."""
        try:
            groups = self._wait(self.zk.get_children_async(CONSUMERS))
        except NoNodeError:
            return []
        found = [(g, self.zk.exists_async(kafka_group_path(g))) for g in groups]
        return sorted(g for g, call in found if self._wait(call) is not None)

    def committed(self, group: str, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed next offsets; partitions without one are absent. The
        reads go out together: half the time of one after another for 50 partitions
        (bench.kafka_groups)."""
        calls = [(tp, self.zk.get_async(offset_path(group, *tp))) for tp in partitions]
        out = {}
        for (topic, partition), call in calls:
            try:
                data, _ = self._wait(call)
            except NoNodeError:
                continue
            try:
                out[(topic, partition)] = decode_offset(data)
            except ValueError:
                logger.error("ignoring unreadable offset %r of group %s at %s-%d", data[:40], group, topic, partition)
        return out

    def committed_all(self, group: str) -> dict[TopicPartition, int]:
        """Every committed offset of the group (OffsetFetch for all topics)."""
        partitions = []
        try:
            topics = self._wait(self.zk.get_children_async(offsets_path(group)))
        except NoNodeError:
            return {}
        for topic in topics:
            try:
                children = self._wait(self.zk.get_children_async(f"{offsets_path(group)}/{topic}"))
                partitions += [(topic, int(p)) for p in children if p.isdigit()]
            except NoNodeError:
                continue
        return self.committed(group, sorted(partitions))

    # ---------------------------------------------------------------- writes

    def write_group(self, group: str, stored: StoredGroup, epoch_version: int) -> None:
        """Record a new generation, or raise CoordinatorFenced."""
        self._write_guarded(epoch_version, [(kafka_group_path(group), stored.encode())])

    def commit(self, group: str, offsets: dict[TopicPartition, int], epoch_version: int) -> None:
        """Store the group's offsets (all or, past NODES_PER_TRANSACTION, in chunks of
        all), or raise CoordinatorFenced."""
        items = sorted(offsets.items())
        for start in range(0, len(items), NODES_PER_TRANSACTION):
            self._write_guarded(epoch_version, [(offset_path(group, t, p), encode_offset(o))
                                                for (t, p), o in items[start:start + NODES_PER_TRANSACTION]])

    def _write_guarded(self, epoch_version: int, writes: list[tuple[str, bytes]], attempts: int = 5) -> None:
        """One transaction: the epoch check, then a set of each node — a create of those
        not there yet (their parents made first), found when a set fails: a group's
        nodes exist after its first commit, so a commit is one round trip."""
        missing: set[str] = set()
        for _ in range(attempts):
            transaction = self.zk.transaction()
            transaction.check(CONTROLLER_EPOCH, epoch_version)
            for path, data in writes:
                if path in missing:
                    transaction.create(path, data)
                else:
                    transaction.set_data(path, data)
            results = self._wait(transaction.commit_async())
            if isinstance(results[0], (BadVersionError, NoNodeError)):
                raise CoordinatorFenced(f"/controller_epoch is no longer at version {epoch_version}")
            failed = [r for r in results[1:] if isinstance(r, Exception)
                      and not isinstance(r, (RolledBackError, RuntimeInconsistency))]
            if not failed:
                return
            if not all(isinstance(r, (NodeExistsError, NoNodeError)) for r in failed):
                raise failed[0]
            missing = {path for path, _ in writes if self._wait(self.zk.exists_async(path)) is None}
            for parent in {path.rsplit("/", 1)[0] for path in missing}:
                self._wait(self.zk.ensure_path_async(parent))
        raise CoordinatorFenced(f"group nodes kept being created and deleted under {attempts} transactions")
