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

How it runs. Each source partition is copied by a thread of its own
(`broker.client.mirror_partition.PartitionTask`, whose docstring says why and with
which timeouts), so a stopped source broker or a leaderless target partition delays
only its own partitions. Each source is watched by a thread of its own
(`SourceWatcher`: topics, partitions, missing target topics). The thread of `run`
writes the checkpoints — each partition's acknowledged state, read under the
partition's lock — and publishes the monitoring events (`broker.client.mirror_events`),
neither of which waits for a partition. What retrying cannot fix stops the mirror with
`MirrorRefused` naming the topic and what to do: at start, a monitoring topic the target
will not create; later, a target topic it may not create, a write or read refused by ACL,
a checkpoint ZooKeeper refuses.

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

import logging
import re
import threading
import time
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError

from broker.client.cluster import ConnectionPool
from broker.client.errors import MirrorRefused, PartitionUnavailable
from broker.client.metadata import ClusterMetadata, connect_zookeeper, open_metadata
from broker.client.mirror_events import MirrorEvents
from broker.client.mirror_partition import Checkpoint, CopySettings, PartitionStatus, PartitionTask
from broker.client.monitoring import DEFAULT_WINDOW_MS, MIRROR_TIER, MONITORING_TOPIC, MonitoringCounter
from broker.client.offsets import advance_group_offsets
from broker.client.security import OPEN, ClientSecurity
from broker.common.errors import AuthenticationError, AuthorizationFailed, LogbusError, TopicAlreadyExists
from broker.common.message import now_ms

logger = logging.getLogger(__name__)

__all__ = ["COUNTS_KEPT_MS", "PARTITIONINGS", "Checkpoint", "Mirror", "MirrorSource", "PartitionStatus"]

PARTITIONINGS = ("same", "key")
COUNTS_KEPT_MS = 48 * 3_600_000
SHUTDOWN_WAIT_S = 10.0  # how long the end of `run` waits for the partitions' calls in flight


@dataclass(frozen=True)
class MirrorSource:
    """A source cluster: its name (in checkpoints and monitoring events) and where it is."""

    name: str
    zookeeper: str | None = None
    brokers: list[str] | str | None = None
    security: ClientSecurity = OPEN


class Mirror:
    """Mirror `topics` (names, or `pattern`, a regular expression) from `sources` into
    the target cluster, whose ZooKeeper holds the checkpoints. `run(stop)` works until
    `stop` is set; `status()` and `lag()` report per source partition.
    `on_mirrored(source, topic, messages)` is called with each acknowledged entry's
    messages, in that partition's thread."""

    def __init__(self, name: str, sources: list[MirrorSource], target_zookeeper: str, *,
                 topics: list[str] | None = None, pattern: str | None = None, partitioning: str = "same",
                 start: str = "earliest", fetch_bytes: int = 1 << 20, fetch_wait_ms: int = 500,
                 fetch_timeout_ms: int = 10_000, checkpoint_interval: float = 1.0, request_timeout_ms: int = 30_000,
                 retry_backoff: float = 0.2, on_mirrored=None, monitoring: bool = True,
                 monitoring_topic: str = MONITORING_TOPIC, monitoring_window_ms: int = DEFAULT_WINDOW_MS,
                 target_security: ClientSecurity = OPEN) -> None:
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
        if not 0 <= fetch_wait_ms < fetch_timeout_ms:
            raise ValueError(f"fetch_timeout_ms ({fetch_timeout_ms}) must exceed fetch_wait_ms ({fetch_wait_ms}), "
                             "which must be >= 0: a long poll would time out")
        self.name = name
        self.settings = CopySettings(partitioning, start, fetch_bytes, fetch_wait_ms, fetch_timeout_ms,
                                     request_timeout_ms, retry_backoff)
        self.checkpoint_interval = checkpoint_interval
        self.on_mirrored = on_mirrored
        self.monitoring_topic = monitoring_topic
        self.monitoring_window_ms = monitoring_window_ms
        self._topics = list(topics) if topics is not None else None
        self._pattern = re.compile(pattern) if pattern is not None else None
        self.target_zookeeper = target_zookeeper
        self.target_zk: KazooClient = connect_zookeeper(target_zookeeper, auth=target_security.zookeeper())
        self.target = open_metadata(target_zookeeper, client_id=f"mirror-{name}", security=target_security)
        self._sources = {s.name: open_metadata(s.zookeeper, s.brokers, f"mirror-{name}", security=s.security)
                         for s in sources}
        self.tasks: dict[tuple[str, str, int], PartitionTask] = {}
        self._lock = threading.Lock()  # guards `tasks`: the watchers add, the checkpoints and `status()` read
        self.halt = threading.Event()  # set at the end of `run`: every thread of the mirror ends
        self._events = MirrorEvents(self.target, f"mirror-{name}-events", monitoring_topic) if monitoring else None

    # ------------------------------------------------------------------ running

    def run(self, stop: threading.Event, discover_every: float = 5.0) -> None:
        """Mirror until `stop` is set, then write every checkpoint. Raises the error
        that stopped the mirror (`MirrorRefused` for what can never work, or a source
        entry no reader can decode), after writing the checkpoints."""
        watchers = [SourceWatcher(self, source, metadata, discover_every)
                    for source, metadata in self._sources.items()]
        try:
            if self._events is not None and not self.mirrors(self.monitoring_topic):
                pool = ConnectionPool(self.target, f"mirror-{self.name}", self.settings.request_timeout_ms / 1000 + 5)
                try:
                    self._events.check_topic(pool, stop, self.settings.retry_backoff, self.target_zookeeper)
                finally:
                    pool.close()
            if not stop.is_set():  # stopped during the check: nothing to start
                for watcher in watchers:
                    watcher.start()
            next_checkpoint = time.monotonic() + self.checkpoint_interval
            while not stop.wait(min(0.1, self.checkpoint_interval)):
                failure = next((t.failure for t in [*watchers, *self._tasks()] if t.failure is not None), None)
                if failure is not None:
                    raise failure
                if time.monotonic() >= next_checkpoint:
                    self.checkpoint()
                    next_checkpoint = time.monotonic() + self.checkpoint_interval
        except Exception as exc:
            logger.error("mirror %s stops: %s", self.name, exc)
            raise
        finally:
            self.halt.set()
            deadline = time.monotonic() + SHUTDOWN_WAIT_S
            for thread in [*watchers, *self._tasks()]:
                if thread.is_alive():
                    thread.join(max(deadline - time.monotonic(), 0.0))
            self.checkpoint()

    def status(self) -> dict[tuple[str, str, int], PartitionStatus]:
        """Each source partition's lag and stall (`PartitionStatus`), never waiting for one."""
        with self._lock:
            tasks = dict(self.tasks)
        return {key: task.status() for key, task in tasks.items()}

    def lag(self) -> dict[tuple[str, str, int], int]:
        """Records of each source partition not yet mirrored (-1: not counted yet)."""
        return {key: status.lag for key, status in self.status().items()}

    def close(self) -> None:
        if self._events is not None:
            self._events.close(10)
        for metadata in [*self._sources.values(), self.target]:
            metadata.close()
        self.target_zk.stop()
        self.target_zk.close()

    # ------------------------------------------------------------ what to mirror

    def mirrors(self, topic: str) -> bool:
        """Whether `topic` is one to mirror (named, or matching the pattern)."""
        return topic in self._topics if self._topics is not None else bool(self._pattern.fullmatch(topic))

    def selected(self, metadata: ClusterMetadata) -> list[str]:
        """The source's topics to mirror."""
        return self._topics if self._topics is not None else [t for t in metadata.topics() if self.mirrors(t)]

    def add_task(self, source: str, topic: str, partition: int) -> None:
        """Start copying `source`/`topic`-`partition`, unless it is being copied."""
        with self._lock:
            if (source, topic, partition) in self.tasks or self.halt.is_set():
                return
            counter = None
            if self._events is not None:
                counter = MonitoringCounter(f"mirror:{self.name}:{source}:{topic}:{partition}",
                                            self.monitoring_window_ms, self.monitoring_topic, tier=MIRROR_TIER,
                                            source=source)
            task = PartitionTask(self.name, source, topic, partition, self._sources[source], self.target,
                                 self.target_zk, self.settings, self.halt, counter, self.on_mirrored)
            self.tasks[(source, topic, partition)] = task
        task.start()

    def _tasks(self) -> list[PartitionTask]:
        with self._lock:
            return list(self.tasks.values())

    # -------------------------------------------------------------- checkpoints

    def checkpoint(self) -> None:
        """Write each partition's acknowledged state where it moved, publish the
        monitoring counts that changed, then commit the same offsets to the source
        group `mirror-<name>` for lag tools — where they moved, and once after a start,
        since a kill may have fallen between the checkpoint and the commit."""
        to_commit: dict[tuple[str, str], dict[int, PartitionTask]] = {}
        tasks = self._tasks()
        for task in tasks:
            state = task.acknowledged(now_ms() - COUNTS_KEPT_MS)
            if state is None:
                continue
            if state.source_offset != task.saved_offset:
                try:
                    self.target_zk.set(task.path, state.encode())
                except NoAuthError as exc:
                    raise MirrorRefused(f"mirror {self.name}: no permission to write its checkpoint {task.path} in "
                                        "the target's ZooKeeper; run the mirror with the target's ZooKeeper "
                                        "credentials") from exc
                except Exception as exc:  # a failed checkpoint costs only re-sent duplicates after a crash
                    logger.warning("mirror %s: checkpoint of %s/%s-%d failed: %s", self.name, task.source,
                                   task.topic, task.partition, exc)
                    continue
                task.saved_offset = state.source_offset
            if task.saved_offset != task.committed_offset:
                to_commit.setdefault((task.source, task.topic), {})[task.partition] = task
        if self._events is not None:
            self._events.publish(task.counter for task in tasks if task.counter is not None)
        for (source, topic), committing in to_commit.items():
            zk = getattr(self._sources[source], "zk", None)
            if zk is not None:
                offsets = {partition: task.saved_offset for partition, task in committing.items()}
                try:
                    advance_group_offsets(zk, f"mirror-{self.name}", topic, offsets)
                except Exception as exc:
                    logger.warning("mirror %s: cannot commit group offsets on %s: %s", self.name, source, exc)
                    continue
                for partition, task in committing.items():
                    task.committed_offset = offsets[partition]


class SourceWatcher(threading.Thread):
    """Finds what to mirror on one source every `every` seconds — its topics and their
    partitions — creates the target topics that are missing, and starts a task for
    each new partition. One per source, so a source that does not answer holds up no
    other; `failure` is a refusal that stops the mirror."""

    def __init__(self, mirror: Mirror, source: str, metadata: ClusterMetadata, every: float) -> None:
        super().__init__(name=f"mirror-{mirror.name}-{source}", daemon=True)
        self.mirror, self.source, self.metadata, self.every = mirror, source, metadata, every
        self.pool = ConnectionPool(mirror.target, f"mirror-{mirror.name}",
                                   mirror.settings.request_timeout_ms / 1000 + 5)
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            while True:
                self._discover()
                if self.mirror.halt.wait(self.every):
                    return
        except Exception as exc:
            self.failure = exc
        finally:
            self.pool.close()

    def _discover(self) -> None:
        try:
            self.metadata.refresh()
            for topic in self.mirror.selected(self.metadata):
                leaders = self.metadata.partitions(topic)
                if not leaders:
                    continue
                self._ensure_target_topic(topic, len(leaders))
                for partition in sorted(leaders):
                    self.mirror.add_task(self.source, topic, partition)
        except MirrorRefused:
            raise
        except (ConnectionError, OSError, LogbusError, KazooException) as exc:  # its ZooKeeper or brokers away
            logger.warning("mirror %s: cannot list source %s yet: %s", self.mirror.name, self.source, exc)

    def _ensure_target_topic(self, topic: str, partitions: int) -> None:
        """Create a missing target topic with the source's partition count and the
        target's default replication factor, and wait for it to appear."""
        target = self.mirror.target
        if target.partitions(topic):
            return
        try:
            self.pool.any().create_topic(topic, partitions, 0)  # 0: the target's default.replication.factor
            logger.info("mirror %s: created target topic %s with %d partitions", self.mirror.name, topic, partitions)
        except TopicAlreadyExists:
            pass
        except (AuthorizationFailed, AuthenticationError) as exc:
            raise MirrorRefused(
                f"mirror {self.mirror.name}: the target cluster refuses to create topic {topic!r} ({type(exc).__name__}"
                f": {exc}): create it there with {partitions} partitions (logbus --zookeeper "
                f"{self.mirror.target_zookeeper} topics create {topic} --partitions {partitions}), or grant the "
                "mirror's principal Create on it") from exc
        deadline = time.monotonic() + 30
        while not target.partitions(topic):
            if time.monotonic() > deadline:
                raise PartitionUnavailable(f"target topic {topic!r} did not appear within 30s")
            target.refresh(topic)
            if self.mirror.halt.wait(0.05):
                return
