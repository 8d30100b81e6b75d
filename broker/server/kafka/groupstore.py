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
    CONSUMERS, CONTROLLER, CONTROLLER_EPOCH, decode_controller, decode_offset, encode_offset, kafka_group_path,
    offset_path, offsets_path,
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
        """The group's committed next offsets; partitions without one are absent. The
        reads go out together: half the time of one after another for 50 partitions
        (bench.kafka_groups)."""
        calls = [(tp, self.zk.get_async(offset_path(group, *tp))) for tp in partitions]
        out = {}
        for (topic, partition), call in calls:
            try:
                data, _ = call.get()
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
            results = transaction.commit()
            if isinstance(results[0], (BadVersionError, NoNodeError)):
                raise CoordinatorFenced(f"/controller_epoch is no longer at version {epoch_version}")
            failed = [r for r in results[1:] if isinstance(r, Exception)
                      and not isinstance(r, (RolledBackError, RuntimeInconsistency))]
            if not failed:
                return
            if not all(isinstance(r, (NodeExistsError, NoNodeError)) for r in failed):
                raise failed[0]
            missing = {path for path, _ in writes if self.zk.exists(path) is None}
            for parent in {path.rsplit("/", 1)[0] for path in missing}:
                self.zk.ensure_path(parent)
        raise CoordinatorFenced(f"group nodes kept being created and deleted under {attempts} transactions")
