"""One source partition of the mirror (`broker.client.mirror`), copied by a thread of
its own: fetch from the source's leader, write to the target, and keep the state a
checkpoint may record — the source offset before which the target acknowledged
everything, and the sequences that go with it.

Why a thread per partition (issue 33): with one loop for every partition, a fetch
from a stopped source broker blocked the loop for its socket timeout, and a write
retried on a leaderless target partition held up every other partition and every
checkpoint — one datacenter's trouble stopped the offline copy of the others. Here a
partition waits only for its own source leader and its own target partitions, each
call bounded: a fetch waits at most `fetch_wait_ms` at the broker for new data (a long
poll, so a message moves as soon as the source exposes it) and `fetch_timeout_ms` in
all for an answer; a write at most `request_timeout_ms` for the target's acks=-1 (its
socket 5 s more). A failed call is retried every `retry_backoff` seconds, for as
long as it takes, and the partition reports itself stalled (`status()`, the log)
until it moves again. What retrying cannot fix — no permission, an entry the target
will not take, a source entry no reader can decode — ends the thread with `failure`,
and the mirror stops with it.

Each task has its own connections (`ConnectionPool` is one thread's), its own
idempotent producer id and sequences (the checkpoint's), and `_lock`, which guards
the acknowledged state (`_acked` and the monitoring counter's counts, which move
together) and the stall report against the mirror's thread reading them.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from itertools import groupby
from typing import Callable, NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoAuthError, NoNodeError

from broker.client.cluster import ConnectionPool
from broker.client.errors import MirrorRefused
from broker.client.metadata import ClusterMetadata
from broker.client.monitoring import MonitoringCounter
from broker.client.offsets import earliest, latest
from broker.client.partitioner import partition_for_key
from broker.client.pipeline import Outgoing, Pipeline
from broker.common.errors import (
    AuthenticationError, AuthorizationFailed, DuplicateSequence, InvalidTopicName, LogbusError, MessageTooLarge,
    OffsetOutOfRange, RequestTooLarge,
)
from broker.common.columns import decode_fetched
from broker.common.message import (
    HEADER, HEADER_SIZE, MIN_ENTRY_SIZE, SEQUENCE_LIMIT, SIZE_FIELD, BatchIdentity, Message, encode_batch, now_ms,
)
from broker.common.protocol import Acks, FetchResponse
from broker.common.zklayout import mirror_checkpoint_path

logger = logging.getLogger(__name__)

# Answers to a write that no retry changes: the principal may not write, or the
# target's limits refuse the entry. Each stops the mirror with a MirrorRefused.
REFUSED_WRITES = (AuthorizationFailed, AuthenticationError, MessageTooLarge, RequestTooLarge, InvalidTopicName)


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


@dataclass(frozen=True)
class CopySettings:
    """How every partition task reads and writes (`Mirror`'s arguments of the same names)."""

    partitioning: str
    start: str
    fetch_bytes: int
    fetch_wait_ms: int
    fetch_timeout_ms: int
    request_timeout_ms: int
    retry_backoff: float


class PartitionStatus(NamedTuple):
    """`lag`: records of the source partition not yet acknowledged by the target, as of
    the source's end at the last answer (`SourceLag`; -1 before the first count);
    `stalled`: seconds since the partition stopped moving, 0 while it moves; `trouble`:
    why, while stalled."""

    lag: int
    stalled: float
    trouble: str | None


def entry_starts(buf: bytes | memoryview, base: int) -> list[int]:
    """The offsets of the whole entries at the front of a fetched set that starts at
    `base`, by their size fields (decoding is `decode_fetched`'s job)."""
    starts, pos, end = [], 0, len(buf)
    while end - pos >= HEADER_SIZE:
        size = HEADER.unpack_from(buf, pos)[0]
        if size < MIN_ENTRY_SIZE or pos + SIZE_FIELD + size > end:
            break
        starts.append(base + pos)
        pos += SIZE_FIELD + size
    return starts


def entries(messages: list[Message], starts: list[int]) -> list[list[Message]]:
    """Messages grouped by the source entry that holds them (`starts`: the entries'
    offsets; a batch's or a compressed set's records have offsets of their own, from
    the entry's on). One group per source entry, wherever a fetch began or ended, is
    what makes a re-sent write the same batches (`target_batches`)."""
    return [list(group) for _, group in groupby(messages, key=lambda m: bisect.bisect_right(starts, m.offset))]


def target_partition(partitioning: str, source_partition: int, key: bytes | None, count: int) -> int:
    """Where a message goes: the source partition's number ("same"), else its key's
    partition of the target's `count`, an unkeyed one the source partition modulo it."""
    if partitioning == "same":
        return source_partition
    return partition_for_key(key, count) if key is not None else source_partition % count


def target_batches(groups: list[list[Message]], producer_id: int, sequences: dict[int, int],
                   target_of: Callable[[Message], int]) -> tuple[list[tuple[int, bytes]], dict[int, int]]:
    """One idempotent batch per source entry and target partition, numbered on from
    `sequences` (next sequence per target partition): a re-send after a restart makes
    the same batches. Returns (target partition, encoded batch) pairs and the sequences
    after them."""
    sequences = dict(sequences)
    batches: list[tuple[int, bytes]] = []
    for group in groups:
        by_target: dict[int, list[Message]] = {}
        for message in group:
            by_target.setdefault(target_of(message), []).append(message)
        for target, messages in by_target.items():
            sequence = sequences.get(target, 0)
            identity = BatchIdentity(producer_id, 0, sequence, len(messages))
            batches.append((target, encode_batch([(m.key, m.value, m.timestamp) for m in messages], identity)))
            sequences[target] = (sequence + len(messages)) % SEQUENCE_LIMIT
    return batches, sequences


class SourceLag:
    """The records of a source partition the target has not acknowledged yet. Offsets
    are not dense (docs/architecture.md, "Offsets"), so the source's leader counts them
    (RECORD_COUNT) — in the partition's own thread, at most every `interval` seconds
    while behind, once and without retries (the fetches report a source in trouble);
    caught up is 0 without asking. `records` is one int the mirror's thread reads."""

    def __init__(self, pool: ConnectionPool, topic: str, partition: int, interval: float = 1.0) -> None:
        self.pool, self.topic, self.partition, self.interval = pool, topic, partition, interval
        self.latest = -1  # the source's end at the last fetch answer
        self.records = -1  # not counted yet
        self._next_count = 0.0

    def update(self, position: int, high_watermark: int | None = None) -> None:
        """Count again from the acknowledged `position`, after a fetch answered `high_watermark`."""
        if high_watermark is not None:
            self.latest = max(self.latest, high_watermark)
        if self.latest < 0:
            return
        if position >= self.latest:
            self.records = 0
            return
        if time.monotonic() < self._next_count:
            return
        self._next_count = time.monotonic() + self.interval
        end = self.latest
        try:
            self.records = self.pool.call_leader(
                self.topic, self.partition, lambda c: c.record_count(self.topic, self.partition, position, end),
                attempts=1).records
        except (ConnectionError, OSError, LogbusError) as exc:
            logger.debug("%s-%d: the lag is not counted: %s", self.topic, self.partition, exc)


class PartitionTask(threading.Thread):
    """Copies `source`/`topic`-`partition` until `halt` is set (module docstring).
    `on_mirrored(source, topic, messages)` runs in this thread after each acknowledged
    entry."""

    def __init__(self, mirror: str, source: str, topic: str, partition: int, source_metadata: ClusterMetadata,
                 target: ClusterMetadata, target_zk: KazooClient, settings: CopySettings, halt: threading.Event,
                 counter: MonitoringCounter | None = None, on_mirrored: Callable | None = None) -> None:
        super().__init__(name=f"mirror-{mirror}-{source}-{topic}-{partition}", daemon=True)
        self.mirror, self.source, self.topic, self.partition = mirror, source, topic, partition
        self.target, self.target_zk, self.settings, self.halt = target, target_zk, settings, halt
        self.counter, self.on_mirrored = counter, on_mirrored
        client_id = f"mirror-{mirror}"
        self.source_pool = ConnectionPool(source_metadata, client_id, settings.fetch_timeout_ms / 1000)
        self.target_pool = ConnectionPool(target, client_id, settings.request_timeout_ms / 1000 + 5)
        self.pipeline = Pipeline(self.target_pool, Acks.FLUSHED, settings.request_timeout_ms)
        self.path = mirror_checkpoint_path(mirror, source, topic, partition)
        self.failure: BaseException | None = None  # what stopped it, for the mirror to raise
        self.saved_offset = -1  # the checkpoint's offset as last written to ZooKeeper (the mirror's thread's)
        # ... and as last committed to the source's group: unknown after a start (a kill
        # may have fallen between the two writes), so the first checkpoint commits it
        self.committed_offset = -1
        self._lock = threading.Lock()
        self._acked: Checkpoint | None = None  # counts left empty: the counter holds them
        self.lag = SourceLag(self.source_pool, topic, partition)
        self._trouble: str | None = None  # why it is stalled, since `_stalled_since` (monotonic)
        self._stalled_since = 0.0

    def __str__(self) -> str:
        return f"mirror {self.mirror}: {self.source}/{self.topic}-{self.partition}"

    def acknowledged(self, counts_since_ms: int) -> Checkpoint | None:
        """The checkpoint of what the target acknowledged so far (None before the
        partition's start is known), with the monitoring counts of windows from
        `counts_since_ms` on — as of the same offset."""
        with self._lock:
            if self._acked is None:
                return None
            counts = self.counter.counts(counts_since_ms) if self.counter is not None else {}
            return Checkpoint(self._acked.producer_id, self._acked.source_offset, dict(self._acked.sequences), counts)

    def status(self) -> PartitionStatus:
        with self._lock:
            stalled = time.monotonic() - self._stalled_since if self._trouble is not None else 0.0
            return PartitionStatus(self.lag.records, stalled, self._trouble)

    def run(self) -> None:
        try:
            self._begin()
            while not self.halt.is_set():
                self._step()
        except InterruptedError:  # halted mid-write: that fetch is not acknowledged, so not checkpointed
            pass
        except Exception as exc:  # a refusal, an undecodable entry: the mirror stops with it
            self.failure = exc
        finally:
            self.source_pool.close()
            self.target_pool.close()

    def _retry(self, trouble: str) -> None:
        """Say once that the partition is stalled and why, then wait before the next try
        (InterruptedError once halted)."""
        if self.halt.is_set():
            raise InterruptedError("halted")
        with self._lock:
            if self._trouble is None:
                self._stalled_since = time.monotonic()
                logger.warning("%s stalled: %s; retrying", self, trouble)
            self._trouble = trouble
        if self.halt.wait(self.settings.retry_backoff):
            raise InterruptedError("halted")

    def _moving(self) -> None:
        if self._trouble is not None:
            with self._lock:
                logger.warning("%s moving again after %.1f s", self, time.monotonic() - self._stalled_since)
                self._trouble = None

    def _begin(self) -> None:
        """Read the partition's checkpoint; for a partition never copied, find its start
        on the source and a producer id of its own and write them as its first
        checkpoint (another instance of this mirror may have been first: then its)."""
        while True:
            try:
                try:
                    checkpoint = Checkpoint.decode(self.target_zk.get(self.path)[0])
                except NoNodeError:
                    find = earliest if self.settings.start == "earliest" else latest
                    checkpoint = Checkpoint(self.target_pool.any().init_producer_id().producer_id,
                                            find(self.source_pool, self.topic, self.partition))
                    try:
                        self.target_zk.create(self.path, checkpoint.encode(), makepath=True)
                    except NodeExistsError:
                        continue
                break
            except (AuthorizationFailed, AuthenticationError) as exc:
                raise MirrorRefused(f"{self} cannot start: {type(exc).__name__}: {exc}; grant the mirror's principal "
                                    f"Read on topic {self.topic!r} in source {self.source} and Write in the target"
                                    ) from exc
            except NoAuthError as exc:
                raise MirrorRefused(f"{self}: no permission to write its checkpoint {self.path} in the target's "
                                    "ZooKeeper; run the mirror with the target's ZooKeeper credentials") from exc
            except (ConnectionError, OSError, LogbusError, KazooException) as exc:
                self._retry(f"cannot start: {type(exc).__name__}: {exc}")
        if self.counter is not None:
            self.counter.restore(checkpoint.counts, now_ms())  # seq above anything a predecessor published
        self.saved_offset = checkpoint.source_offset
        with self._lock:
            self._acked = Checkpoint(checkpoint.producer_id, checkpoint.source_offset, checkpoint.sequences)
        logger.info("%s from offset %d (producer id %d)", self, checkpoint.source_offset, checkpoint.producer_id)

    def _step(self) -> None:
        """One fetch (a long poll) and the write of what it brought."""
        position = self._acked.source_offset
        settings = self.settings
        try:
            response: FetchResponse = self.source_pool.call_leader(
                self.topic, self.partition, lambda c: c.fetch(self.topic, self.partition, position,
                                                              settings.fetch_bytes, settings.fetch_wait_ms, 1),
                attempts=1)
        except OffsetOutOfRange:
            self._skip_deleted(position)
            return
        except (AuthorizationFailed, AuthenticationError) as exc:
            raise MirrorRefused(f"{self}: source {self.source} refuses to be read: {type(exc).__name__}: {exc}; "
                                f"grant the mirror's principal Read on topic {self.topic!r} there") from exc
        except (ConnectionError, OSError, LogbusError) as exc:
            self._retry(f"fetch from source {self.source} failed: {type(exc).__name__}: {exc}")
            self.source_pool.metadata.refresh(self.topic)
            return
        columns = decode_fetched(response.messages, response.set_offset, position)
        messages, corrupt = columns.messages(), columns.corrupt
        if corrupt is not None and not messages:
            raise corrupt  # a source entry no reader can decode: stop rather than skip data silently
        self._moving()
        if messages and not self.halt.is_set():  # halted during a slow answer: the last checkpoint is written
            self._write(entries(messages, entry_starts(response.messages, response.set_offset)))
        self.lag.update(self._acked.source_offset, response.high_watermark)

    def _skip_deleted(self, position: int) -> None:
        """The source's retention deleted `position`: go on from its earliest offset
        (those messages are lost to the mirror, and the log says so)."""
        try:
            reset = earliest(self.source_pool, self.topic, self.partition)
        except (ConnectionError, OSError, LogbusError) as exc:
            self._retry(f"offset {position} is gone and the earliest is unknown: {type(exc).__name__}: {exc}")
            return
        logger.warning("%s offset %d is gone (retention); skipping to %d", self, position, reset)
        with self._lock:
            self._acked = Checkpoint(self._acked.producer_id, reset, self._acked.sequences)

    def _target_count(self) -> int:
        """The target topic's partition count, which `partitioning="key"` needs (0 for
        "same"), waited for while the target's metadata does not know it."""
        if self.settings.partitioning == "same":
            return 0
        while not (leaders := self.target.partitions(self.topic)):
            self._retry(f"target topic {self.topic!r} is unknown")
            self.target.refresh(self.topic)
        return len(leaders)

    def _write(self, groups: list[list[Message]]) -> None:
        """Send the entries as batches, retrying until the target acknowledged all of
        them; only then does the acknowledged position move past them."""
        count = self._target_count()
        partitioning, partition = self.settings.partitioning, self.partition
        batches, sequences = target_batches(
            groups, self._acked.producer_id, self._acked.sequences,
            lambda m: target_partition(partitioning, partition, m.key, count))
        pending = list(range(len(batches)))
        while pending:
            leaders = self.target.partitions(self.topic) or {}
            outgoing = [Outgoing(i, self.topic, batches[i][0], leaders.get(batches[i][0], -1), batches[i][1])
                        for i in pending]
            ready = [o for o in outgoing if o.leader >= 0]
            outcomes = self.pipeline.send(ready) if ready else []
            done = {o.batch for o in outcomes if o.error is None or isinstance(o.error, DuplicateSequence)}
            refused = next((o.error for o in outcomes if isinstance(o.error, REFUSED_WRITES)), None)
            if refused is not None:
                raise MirrorRefused(
                    f"{self}: the target refuses its writes to topic {self.topic!r}: {type(refused).__name__}: "
                    f"{refused}; grant the mirror's principal Write on that topic, or raise the target's limits "
                    "(message.max.bytes, socket.request.max.bytes) to the source's") from refused
            pending = [i for i in pending if i not in done]
            if pending:
                errors = sorted({type(o.error).__name__ for o in outcomes if o.batch not in done}) or ["no leader"]
                self._retry(f"{len(pending)} batches to target topic {self.topic!r} not acknowledged "
                            f"({', '.join(errors)})")
                self.target.refresh(self.topic)
        with self._lock:
            self._acked = Checkpoint(self._acked.producer_id, groups[-1][-1].next_offset, sequences)
            if self.counter is not None:
                self.counter.record(self.topic, (m for group in groups for m in group))
        self._moving()
        if self.on_mirrored is not None:
            for group in groups:
                self.on_mirrored(self.source, self.topic, group)
