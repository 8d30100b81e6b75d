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
Blocking calls: the request handlers run them in a thread.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError, RuntimeInconsistency

from broker.common.zklayout import (
    CONSUMERS, CONTROLLER, CONTROLLER_EPOCH, decode_controller, encode_offset, kafka_group_path, offset_path,
    offsets_path, read_offset,
)

logger = logging.getLogger(__name__)

NODES_PER_TRANSACTION = 500  # ZooKeeper bounds a request (jute.maxbuffer, 1 MB)

TopicPartition = tuple[str, int]


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
    def __init__(self, zk: KazooClient, broker_id: int) -> None:
        self.zk = zk
        self.broker_id = broker_id

    def coordinator(self) -> CoordinatorEpoch:
        """Read who coordinates. This broker coordinates while `/controller` names it,
        is its own session's node, and `/controller_epoch` was bumped after that node
        was created (its mzxid is later than the node's czxid): until the new
        controller's bump, the version is the predecessor's, which a deposed coordinator
        could still write with; `loading` says so (COORDINATOR_LOAD_IN_PROGRESS)."""
        try:
            data, stat = self.zk.get(CONTROLLER)
            controller = decode_controller(data)
        except (NoNodeError, ValueError, KeyError, TypeError):
            return CoordinatorEpoch(None)
        if controller != self.broker_id or stat.ephemeralOwner != self.zk.client_id[0]:
            return CoordinatorEpoch(controller)
        try:
            epoch = self.zk.get(CONTROLLER_EPOCH)[1]
        except NoNodeError:
            return CoordinatorEpoch(controller, loading=True)
        if epoch.mzxid < stat.czxid:
            return CoordinatorEpoch(controller, loading=True)
        return CoordinatorEpoch(controller, epoch.version)

    # ----------------------------------------------------------------- reads

    def read_group(self, group: str) -> StoredGroup | None:
        try:
            data, _ = self.zk.get(kafka_group_path(group))
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
            groups = self.zk.get_children(CONSUMERS)
        except NoNodeError:
            return []
        return sorted(g for g in groups if self.zk.exists(kafka_group_path(g)) is not None)

    def committed(self, group: str, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed next offsets; partitions without one are absent."""
        out = {}
        for topic, partition in partitions:
            offset = read_offset(self.zk, group, topic, partition)
            if offset is not None:
                out[(topic, partition)] = offset
        return out

    def committed_all(self, group: str) -> dict[TopicPartition, int]:
        """Every committed offset of the group (OffsetFetch for all topics)."""
        partitions = []
        try:
            topics = self.zk.get_children(offsets_path(group))
        except NoNodeError:
            return {}
        for topic in topics:
            try:
                partitions += [(topic, int(p)) for p in self.zk.get_children(f"{offsets_path(group)}/{topic}")
                               if p.isdigit()]
            except NoNodeError:
                continue
        return self.committed(group, sorted(partitions))

    # ---------------------------------------------------------------- writes

    def write_group(self, group: str, stored: StoredGroup, epoch_version: int) -> None:
        """Record a new generation, or raise CoordinatorFenced."""
        path = kafka_group_path(group)
        exists = self.zk.exists(path) is not None
        if not exists:
            self.zk.ensure_path(f"{CONSUMERS}/{group}")
        self._commit_guarded(epoch_version, [(path, stored.encode(), exists)])

    def commit(self, group: str, offsets: dict[TopicPartition, int], epoch_version: int) -> None:
        """Store the group's offsets (all or, past NODES_PER_TRANSACTION, in chunks of
        all), or raise CoordinatorFenced."""
        for topic in {t for t, _ in offsets}:
            self.zk.ensure_path(f"{offsets_path(group)}/{topic}")
        items = sorted(offsets.items())
        for start in range(0, len(items), NODES_PER_TRANSACTION):
            chunk = items[start:start + NODES_PER_TRANSACTION]
            paths = [offset_path(group, t, p) for (t, p), _ in chunk]
            exists = [r.get() is not None for r in [self.zk.exists_async(p) for p in paths]]
            writes = [(path, encode_offset(o), e) for path, (_, o), e in zip(paths, chunk, exists)]
            self._commit_guarded(epoch_version, writes)

    def _commit_guarded(self, epoch_version: int, writes: list[tuple[str, bytes, bool]], attempts: int = 5) -> None:
        """One transaction: the epoch check, then a set or a create per node. A node
        created or deleted meanwhile by someone else flips set and create; retried."""
        for _ in range(attempts):
            transaction = self.zk.transaction()
            transaction.check(CONTROLLER_EPOCH, epoch_version)
            for path, data, exists in writes:
                if exists:
                    transaction.set_data(path, data)
                else:
                    transaction.create(path, data)
            results = transaction.commit()
            if isinstance(results[0], (BadVersionError, NoNodeError)):
                raise CoordinatorFenced(f"/controller_epoch is no longer at version {epoch_version}")
            failed = [r for r in results[1:] if isinstance(r, Exception) and not isinstance(r, (RolledBackError, RuntimeInconsistency))]
            if not failed:
                return
            if not all(isinstance(r, (NodeExistsError, NoNodeError)) for r in failed):
                raise failed[0]
            writes = [(p, d, self.zk.exists(p) is not None) for p, d, _ in writes]
        raise CoordinatorFenced(f"group nodes kept being created and deleted under {attempts} transactions")
