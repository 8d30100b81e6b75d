"""The mirror (docs/operations.md, "Mirroring"): the Kafka paper's embedded consumers
(section 4, Figure 3) — topics pulled from the clusters of the live datacenters into
one cluster in the offline datacenter — exactly once, also across kill -9 of the
mirror itself.

How exactly once works. Every source partition writes to the target through its own
idempotent producer id (allocated once, kept in the mirror's checkpoint), and its
batches are made deterministically from the source log: each source *entry* (a
message, a compressed set, a producer batch) becomes one target batch per target
partition it maps to, numbered by a per-target-partition sequence that counts the
messages mirrored so far. The checkpoint — in the target cluster's ZooKeeper,
`zklayout.mirror_checkpoint_path` — holds (producer id, source offset, next
sequences) and is written only after the target acknowledged (acks=-1) everything
before that source offset. A mirror restarted after a crash reads from the
checkpoint's offset with the checkpoint's sequences, so it rebuilds exactly the
batches it sent before, and the target broker answers each one it already holds as
a duplicate (the batch's offsets, or `DuplicateSequence` for older ones) instead of
appending it. The checkpoint is therefore only ever behind what the target holds,
and the group offset the mirror commits on the source (for lag tools) is the
checkpoint's.

Monitoring events (tier `mirror`, `broker.client.monitoring`): each source partition
counts what it mirrored per topic and window of message timestamps under a counter
identity of its own (`mirror:<name>:<source>:<topic>:<partition>`), published into the
target's monitoring topic at every checkpoint. The counts travel in the checkpoint, so a
restarted mirror continues them from there and counts what it re-sends after the
checkpoint once: the mirror tier counts what the target holds, however often the mirror
dies. Windows older than `COUNTS_KEPT_MS` leave the checkpoint (a re-send never reaches
that far back).

Messages keep key, timestamp and value. A message goes to the target partition of
the same number (`partitioning="same"`; the target topic is created with the source's
partition count when missing), or with `partitioning="key"` to its key's partition
(unkeyed: the source partition modulo the target's count), for targets whose count
differs. Two mirror processes with one name are safe (the broker dedupes their
identical batches) but pointless.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from itertools import groupby

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, NodeExistsError

from broker.client.cluster import ConnectionPool
from broker.client.metadata import ClusterMetadata, connect_zookeeper, open_metadata
from broker.client.errors import PartitionUnavailable
from broker.client.monitoring import DEFAULT_WINDOW_MS, MIRROR_TIER, MONITORING_TOPIC, MonitoringCounter
from broker.client.offsets import advance_group_offsets, earliest, latest
from broker.client.partitioner import partition_for_key
from broker.client.pipeline import Outgoing, Pipeline
from broker.client.producer import Producer
from broker.client.security import OPEN, ClientSecurity
from broker.common.errors import DuplicateSequence, LogbusError, OffsetOutOfRange, TopicAlreadyExists
from broker.common.message import SEQUENCE_LIMIT, BatchIdentity, Message, decode_messages, encode_batch, now_ms
from broker.common.protocol import Acks, FetchResponse
from broker.common.zklayout import mirror_checkpoint_path

logger = logging.getLogger(__name__)

PARTITIONINGS = ("same", "key")
COUNTS_KEPT_MS = 48 * 3_600_000


@dataclass(frozen=True)
class MirrorSource:
    """A source cluster: its name (in checkpoints and monitoring events) and where it is."""

    name: str
    zookeeper: str | None = None
    brokers: list[str] | str | None = None
    security: ClientSecurity = OPEN


@dataclass
class Checkpoint:
    """Where the mirroring of one source partition stands: everything before
    `source_offset` is acknowledged by the target; `sequences[target partition]` is
    the next sequence of `producer_id` there."""

    producer_id: int
    source_offset: int
    sequences: dict[int, int] = field(default_factory=dict)
    counts: dict[str, list[int]] = field(default_factory=dict)  # monitoring counts as of source_offset

    def encode(self) -> bytes:
        return json.dumps({"producer_id": self.producer_id, "source_offset": self.source_offset,
                           "sequences": {str(k): v for k, v in self.sequences.items()},
                           "counts": self.counts}).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Checkpoint":
        raw = json.loads(data)
        return cls(int(raw["producer_id"]), int(raw["source_offset"]),
                   {int(k): int(v) for k, v in raw["sequences"].items()}, dict(raw.get("counts", {})))


@dataclass
class PartitionTask:
    """One source partition being mirrored."""

    source: str
    topic: str
    partition: int
    checkpoint: Checkpoint
    position: int  # next source offset to read (at or past the checkpoint's)
    saved_offset: int  # the checkpoint's offset as written to ZooKeeper
    counter: MonitoringCounter | None = None  # what it mirrored, per topic and window (tier "mirror")
    latest: int = -1  # the source's end at the last look, for lag

    @property
    def lag(self) -> int:
        return max(self.latest - self.position, 0) if self.latest >= 0 else -1


def entries(messages: list[Message]) -> list[list[Message]]:
    """Messages grouped by the source entry that holds them (a wrapper's share its offset)."""
    return [list(group) for _, group in groupby(messages, key=lambda m: m.offset)]


class Mirror:
    """Mirror `topics` (names, or `pattern`, a regular expression) from `sources` into
    the target cluster, whose ZooKeeper holds the checkpoints. `run(stop)` works until
    `stop` is set; `lag()` reports per-partition lag. `on_mirrored(source, topic,
    messages)` is called with each acknowledged entry's messages (monitoring)."""

    def __init__(self, name: str, sources: list[MirrorSource], target_zookeeper: str, *,
                 topics: list[str] | None = None, pattern: str | None = None, partitioning: str = "same",
                 start: str = "earliest", fetch_bytes: int = 1 << 20, checkpoint_interval: float = 1.0,
                 request_timeout_ms: int = 30_000, retry_backoff: float = 0.2, on_mirrored=None,
                 monitoring: bool = True, monitoring_topic: str = MONITORING_TOPIC,
                 monitoring_window_ms: int = DEFAULT_WINDOW_MS, target_security: ClientSecurity = OPEN) -> None:
        if partitioning not in PARTITIONINGS:
            raise ValueError(f"partitioning must be one of {', '.join(PARTITIONINGS)}, not {partitioning!r}")
        if start not in ("earliest", "latest"):
            raise ValueError(f"start must be 'earliest' or 'latest', not {start!r}")
        if (topics is None) == (pattern is None):
            raise ValueError("give exactly one of topics= (a list) or pattern= (a regular expression)")
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise ValueError(f"mirror name {name!r}: use the characters A-Z a-z 0-9 . _ -")
        names = [s.name for s in sources]
        if not sources or len(set(names)) != len(names):
            raise ValueError(f"give one or more sources with distinct names, not {names}")
        self.name = name
        self.partitioning = partitioning
        self.start = start
        self.fetch_bytes = fetch_bytes
        self.checkpoint_interval = checkpoint_interval
        self.retry_backoff = retry_backoff
        self.on_mirrored = on_mirrored
        self.monitoring_topic = monitoring_topic
        self.monitoring_window_ms = monitoring_window_ms
        self._topics = list(topics) if topics is not None else None
        self._pattern = re.compile(pattern) if pattern is not None else None
        self._sources = {s.name: s for s in sources}
        self._source_metadata: dict[str, ClusterMetadata] = {}
        self._source_pools: dict[str, ConnectionPool] = {}
        self.target_zk: KazooClient = connect_zookeeper(target_zookeeper, auth=target_security.zookeeper())
        self.target = open_metadata(target_zookeeper, client_id=f"mirror-{name}", security=target_security)
        self.target_pool = ConnectionPool(self.target, f"mirror-{name}", request_timeout_ms / 1000 + 5)
        self.pipeline = Pipeline(self.target_pool, Acks.FLUSHED, request_timeout_ms)
        self.tasks: dict[tuple[str, str, int], PartitionTask] = {}
        self._lock = threading.Lock()  # guards `tasks` for `lag()` from other threads
        # publishes the tasks' monitoring events into the target (acks=-1: the audit's ground truth)
        self._events = Producer(metadata=self.target, acks=-1, monitoring=False, client_id=f"mirror-{name}-events",
                                linger_ms=0) if monitoring else None
        for source in sources:
            self._source_metadata[source.name] = open_metadata(source.zookeeper, source.brokers, f"mirror-{name}",
                                                                 security=source.security)
            self._source_pools[source.name] = ConnectionPool(self._source_metadata[source.name], f"mirror-{name}",
                                                             request_timeout_ms / 1000 + 5)

    # ------------------------------------------------------------------ running

    def run(self, stop: threading.Event, discover_every: float = 5.0) -> None:
        """Mirror until `stop` is set, then write every checkpoint."""
        next_discovery = 0.0
        next_checkpoint = time.monotonic() + self.checkpoint_interval
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now >= next_discovery:
                    self._discover()
                    next_discovery = now + discover_every
                moved = 0
                for task in list(self.tasks.values()):
                    if stop.is_set():
                        break
                    try:
                        moved += self._step(task, stop)
                    except InterruptedError:  # stopped mid-write: that fetch is not checkpointed
                        break
                if time.monotonic() >= next_checkpoint:
                    self.checkpoint()
                    next_checkpoint = time.monotonic() + self.checkpoint_interval
                if not moved:
                    stop.wait(0.05)
        finally:
            self.checkpoint()

    def lag(self) -> dict[tuple[str, str, int], int]:
        """Bytes of each source partition not yet mirrored (-1: not looked at yet)."""
        with self._lock:
            return {key: task.lag for key, task in self.tasks.items()}

    def close(self) -> None:
        if self._events is not None:
            self._events.close(30)
        for pool in [*self._source_pools.values(), self.target_pool]:
            pool.close()
        for metadata in [*self._source_metadata.values(), self.target]:
            metadata.close()
        self.target_zk.stop()
        self.target_zk.close()

    # ------------------------------------------------------------ what to mirror

    def _discover(self) -> None:
        for source, metadata in self._source_metadata.items():
            try:
                metadata.refresh()
                topics = self._topics if self._topics is not None else [
                    t for t in metadata.topics() if self._pattern.fullmatch(t)]
                for topic in topics:
                    leaders = metadata.partitions(topic)
                    if not leaders:
                        continue
                    self._ensure_target_topic(topic, len(leaders))
                    for partition in sorted(leaders):
                        if (source, topic, partition) not in self.tasks:
                            self._add_task(source, topic, partition)
            except (ConnectionError, OSError, LogbusError) as exc:
                logger.warning("mirror %s: cannot list source %s yet: %s", self.name, source, exc)

    def _ensure_target_topic(self, topic: str, partitions: int) -> None:
        if self.target.partitions(topic):
            return
        conn = self.target_pool.any()
        try:
            conn.create_topic(topic, partitions, 0)  # 0: the target's default.replication.factor
            logger.info("mirror %s: created target topic %s with %d partitions", self.name, topic, partitions)
        except TopicAlreadyExists:
            pass
        deadline = time.monotonic() + 30
        while not self.target.partitions(topic):
            if time.monotonic() > deadline:
                raise PartitionUnavailable(f"target topic {topic!r} did not appear within 30s")
            self.target.refresh(topic)
            time.sleep(0.05)

    def _add_task(self, source: str, topic: str, partition: int) -> None:
        path = mirror_checkpoint_path(self.name, source, topic, partition)
        try:
            checkpoint = Checkpoint.decode(self.target_zk.get(path)[0])
        except NoNodeError:
            pool = self._source_pools[source]
            offset = (earliest if self.start == "earliest" else latest)(pool, topic, partition)
            checkpoint = Checkpoint(self.target_pool.any().init_producer_id().producer_id, offset)
            try:
                self.target_zk.create(path, checkpoint.encode(), makepath=True)
            except NodeExistsError:  # another instance of this mirror got there first: use its
                checkpoint = Checkpoint.decode(self.target_zk.get(path)[0])
        task = PartitionTask(source, topic, partition, checkpoint, checkpoint.source_offset, checkpoint.source_offset)
        if self._events is not None:
            task.counter = MonitoringCounter(f"mirror:{self.name}:{source}:{topic}:{partition}",
                                             self.monitoring_window_ms, self.monitoring_topic, tier=MIRROR_TIER,
                                             source=source)
            task.counter.restore(checkpoint.counts, now_ms())  # seq above anything a predecessor published
        with self._lock:
            self.tasks[(source, topic, partition)] = task
        logger.info("mirror %s: %s/%s-%d from offset %d (producer id %d)", self.name, source, topic, partition,
                    task.position, checkpoint.producer_id)

    # ---------------------------------------------------------------- one step

    def _step(self, task: PartitionTask, stop: threading.Event) -> int:
        """Mirror one fetch of `task`'s partition; the messages moved."""
        pool = self._source_pools[task.source]
        try:
            response: FetchResponse = pool.call_leader(
                task.topic, task.partition, lambda c: c.fetch(task.topic, task.partition, task.position,
                                                              self.fetch_bytes))
        except OffsetOutOfRange:
            reset = earliest(pool, task.topic, task.partition)
            logger.warning("mirror %s: %s/%s-%d offset %d is gone (retention); skipping to %d", self.name,
                           task.source, task.topic, task.partition, task.position, reset)
            task.position = reset
            return 0
        except (ConnectionError, OSError, LogbusError) as exc:
            logger.info("mirror %s: fetch of %s/%s-%d failed: %s", self.name, task.source, task.topic,
                        task.partition, exc)
            return 0
        task.latest = max(response.high_watermark, task.latest)
        messages, corrupt = decode_messages(response.messages, task.position)
        if corrupt is not None and not messages:
            raise corrupt  # a source entry no reader can decode: stop rather than skip data silently
        if not messages:
            return 0
        groups = entries(messages)
        self._write(task, groups, stop)
        return sum(len(g) for g in groups)

    def _target_partition(self, task: PartitionTask, message: Message, count: int) -> int:
        if self.partitioning == "same":
            return task.partition
        if message.key is not None:
            return partition_for_key(message.key, count)
        return task.partition % count

    def _write(self, task: PartitionTask, groups: list[list[Message]], stop: threading.Event) -> None:
        """Send the entries as batches, retrying until the target acknowledged all of
        them (or `stop`); only then does the task's position move past them."""
        leaders = self.target.partitions(task.topic) or {}
        count = len(leaders) if self.partitioning == "key" else 0
        sequences = dict(task.checkpoint.sequences)
        batches: list[tuple[int, bytes]] = []
        for group in groups:
            by_target: dict[int, list[Message]] = {}
            for message in group:
                by_target.setdefault(self._target_partition(task, message, count), []).append(message)
            for target, messages in by_target.items():
                sequence = sequences.get(target, 0)
                identity = BatchIdentity(task.checkpoint.producer_id, 0, sequence, len(messages))
                batches.append((target, encode_batch([(m.key, m.value, m.timestamp) for m in messages], identity)))
                sequences[target] = (sequence + len(messages)) % SEQUENCE_LIMIT
        pending = list(range(len(batches)))
        while pending:
            leaders = self.target.partitions(task.topic) or {}
            outgoing = [Outgoing(i, task.topic, batches[i][0], leaders.get(batches[i][0], -1), batches[i][1])
                        for i in pending]
            ready = [o for o in outgoing if o.leader >= 0]
            outcomes = self.pipeline.send(ready) if ready else []
            done = {o.batch for o in outcomes if o.error is None or isinstance(o.error, DuplicateSequence)}
            pending = [i for i in pending if i not in done]
            if pending:
                errors = {type(o.error).__name__ for o in outcomes if o.batch not in done}
                logger.info("mirror %s: %d batches of %s/%s-%d not acknowledged yet (%s); retrying", self.name,
                            len(pending), task.source, task.topic, task.partition, ", ".join(sorted(errors)) or
                            "no leader")
                if stop.wait(self.retry_backoff):
                    raise InterruptedError("stopped with batches unacknowledged")
                self.target.refresh(task.topic)
        task.checkpoint.sequences = sequences
        task.position = groups[-1][-1].next_offset
        if task.counter is not None:
            task.counter.record(task.topic, (m for group in groups for m in group))
        if self.on_mirrored is not None:
            for group in groups:
                self.on_mirrored(task.source, task.topic, group)

    # -------------------------------------------------------------- checkpoints

    def _publish_events(self) -> None:
        """Publish the counts that changed, and wait for them: a checkpoint written
        after its events is never ahead of what the audit can read."""
        if self._events is None:
            return
        for task in list(self.tasks.values()):
            if task.counter is not None and task.counter.pending():
                for key, value in task.counter.events():
                    self._events.send(self.monitoring_topic, value, key=key)
        report = self._events.flush(30)
        if report.failed:
            logger.warning("mirror %s: %d monitoring events not published: %s", self.name, len(report.failed),
                           report.failed[0].error)

    def checkpoint(self) -> None:
        """Write each task's position and sequences (all acknowledged by the target),
        then commit the same offsets to the source group `mirror-<name>` for lag tools."""
        committed: dict[tuple[str, str], dict[int, int]] = {}
        self._publish_events()
        for task in list(self.tasks.values()):
            if task.position == task.saved_offset:
                continue
            task.checkpoint.source_offset = task.position
            if task.counter is not None:
                task.checkpoint.counts = task.counter.counts(now_ms() - COUNTS_KEPT_MS)
            try:
                self.target_zk.set(mirror_checkpoint_path(self.name, task.source, task.topic, task.partition),
                                   task.checkpoint.encode())
            except Exception as exc:  # a failed checkpoint costs only re-sent duplicates after a crash
                logger.warning("mirror %s: checkpoint of %s/%s-%d failed: %s", self.name, task.source, task.topic,
                               task.partition, exc)
                continue
            task.saved_offset = task.position
            committed.setdefault((task.source, task.topic), {})[task.partition] = task.position
        for (source, topic), offsets in committed.items():
            metadata = self._source_metadata[source]
            zk = getattr(metadata, "zk", None)
            if zk is not None:
                try:
                    advance_group_offsets(zk, f"mirror-{self.name}", topic, offsets)
                except Exception as exc:
                    logger.warning("mirror %s: cannot commit group offsets on %s: %s", self.name, source, exc)
