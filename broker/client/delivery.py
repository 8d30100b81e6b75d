"""The producer's delivery loop, shared by sync and async modes.

`Delivery` holds records until they are delivered or given up:

- *unassigned*: records waiting for a partition (unknown topic, no available
  partition, or an unkeyed record to re-place after a failure);
- *accumulators*: per (topic, partition), records in send order, waiting to fill a
  batch (`batch_size` records or `batch_bytes`), for `linger` to pass, or for the
  partition's leader to come back.

`run_once()` places records, cuts ready batches, sends them through `BatchSender`
(pipelined, one round per call) and sorts the results: delivered, retried, or failed.
Retriable errors (leader moved, broker down, connection lost) refresh the metadata;
an unkeyed record without an explicit partition is retried on another available
partition, a keyed or explicitly placed one on its own partition. A record not
delivered within `delivery_timeout` fails. The owner (the caller's thread in sync mode,
the sender thread in async mode) calls `run_once` from one thread at a time; `_lock`
guards the record structures so `abandon()` may be called from another thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from broker.client.cluster import ClusterMetadata, ConnectionPool, available, ensure_topic
from broker.client.errors import PartitionUnavailable
from broker.client.partitioner import choose_partition
from broker.client.sender import Batch, BatchSender
from broker.errors import (
    BrokerShuttingDown, LogbusError, NotLeaderForPartition, UnknownPartition, UnknownTopic,
)
from broker.message import HEADER_SIZE, Codec

logger = logging.getLogger(__name__)


class ProducerRecord:
    """One message on its way. `partition` is the explicit partition or None; `fixed`
    says whether it may move (explicit or keyed records may not)."""

    __slots__ = ("topic", "key", "value", "timestamp", "partition", "fixed", "attempts", "internal",
                 "enqueued", "avoid", "not_before", "offset", "error", "done")

    def __init__(self, topic: str, key: bytes | None, value: bytes, timestamp: int, partition: int | None,
                 internal: bool = False) -> None:
        self.topic = topic
        self.key = key
        self.value = value
        self.timestamp = timestamp
        self.partition = partition
        self.fixed = partition is not None
        self.attempts = 0
        self.internal = internal  # a monitoring event: not counted, not reported as a user failure
        self.enqueued = time.monotonic()
        self.avoid: int | None = None
        self.not_before = 0.0
        self.offset: int | None = None
        self.error: BaseException | None = None
        self.done = False


@dataclass
class _Accumulator:
    records: deque = field(default_factory=deque)
    bytes: int = 0
    not_before: float = 0.0


def _retriable(error: BaseException) -> bool:
    return isinstance(error, (ConnectionError, OSError, NotLeaderForPartition, BrokerShuttingDown, UnknownTopic,
                              PartitionUnavailable)) or getattr(error, "retriable", False)


class Delivery:
    def __init__(
        self, metadata: ClusterMetadata, pool: ConnectionPool, sender: BatchSender, codec: Codec,
        batch_size: int, batch_bytes: int, linger: float, retries: int, retry_backoff: float,
        delivery_timeout: float, on_delivered: Callable[[Batch], None], on_failed: Callable[[list[ProducerRecord]], None],
        track_offsets: bool = False,
    ) -> None:
        self.metadata = metadata
        self.pool = pool
        self.sender = sender
        self.codec = codec
        self.batch_size = max(1, batch_size)
        self.batch_bytes = batch_bytes
        self.linger = linger
        self.retries = retries
        self.retry_backoff = retry_backoff
        self.delivery_timeout = delivery_timeout
        self.on_delivered = on_delivered
        self.on_failed = on_failed
        self.track_offsets = track_offsets
        self._lock = threading.Lock()
        self._unassigned: deque[ProducerRecord] = deque()
        self._parts: dict[tuple[str, int], _Accumulator] = {}
        self._in_flight: list[Batch] = []
        self._topic_retry_at: dict[str, float] = {}
        self.abandoned = False

    # ------------------------------------------------------------------------ intake

    def add(self, records) -> None:
        with self._lock:
            self._unassigned.extend(records)

    def empty(self) -> bool:
        with self._lock:
            return not self._unassigned and not self._in_flight and not any(a.records for a in self._parts.values())

    def abandon(self) -> list[ProducerRecord]:
        """Take every record still held (even in flight): the producer gives up on them."""
        with self._lock:
            self.abandoned = True
            records = list(self._unassigned)
            for acc in self._parts.values():
                records.extend(acc.records)
            for batch in self._in_flight:
                records.extend(batch.records)
            self._unassigned.clear()
            self._parts.clear()
            self._in_flight = []
        return [r for r in records if not r.done]

    # ------------------------------------------------------------------------- rounds

    def run_once(self, flush: bool = False) -> float:
        """One round: place, cut, send, sort. Returns seconds until the next round is
        useful (a linger or back-off ending), for the caller's wait."""
        now = time.monotonic()
        self._place(now)
        batches = self._cut(now, flush)
        self._expire(now)
        if batches:
            for batch in batches:
                batch.encode(self.codec)
            self.sender.send(batches)
            with self._lock:
                self._in_flight = []
            if not self.abandoned:
                self._sort(batches)
        return self._next_wake(time.monotonic(), flush)

    def _leaders(self, topic: str, now: float) -> tuple[dict[int, int] | None, BaseException | None]:
        """(leaders, None), or (None, None) to wait, or (None, error) when the topic
        cannot exist (auto-creation is off)."""
        leaders = self.metadata.partitions(topic)
        if leaders is not None or now < self._topic_retry_at.get(topic, 0.0):
            return leaders, None
        try:
            return ensure_topic(self.metadata, self.pool, topic), None
        except UnknownTopic as exc:
            self._topic_retry_at[topic] = now + self.retry_backoff
            if "auto.create" in str(exc):
                return None, exc
        except (ConnectionError, OSError, LogbusError) as exc:
            logger.info("cannot create or find topic %s yet: %s", topic, exc)
            self._topic_retry_at[topic] = now + self.retry_backoff
        return None, None

    def _place(self, now: float) -> None:
        with self._lock:
            waiting = list(self._unassigned)
            self._unassigned.clear()
        if not waiting:
            return
        keep: list[ProducerRecord] = []
        placed: list[tuple[tuple[str, int], ProducerRecord]] = []
        failed: list[tuple[ProducerRecord, BaseException]] = []
        leaders_of: dict[str, tuple[dict[int, int] | None, BaseException | None]] = {}
        live_of: dict[str, list[int]] = {}
        randrange = random.randrange
        for r in waiting:
            if r.not_before > now:
                keep.append(r)
                continue
            if r.topic not in leaders_of:
                leaders_of[r.topic] = self._leaders(r.topic, now)
            leaders, fatal = leaders_of[r.topic]
            if fatal is not None:
                failed.append((r, fatal))
                continue
            if leaders is None:
                keep.append(r)
                continue
            if r.fixed:
                if r.partition not in leaders:
                    failed.append((r, UnknownPartition(f"topic {r.topic!r} has no partition {r.partition}")))
                    continue
                partition = r.partition
            elif r.key is None and r.avoid is None:  # the common case: random among available, list made once
                live = live_of.get(r.topic)
                if live is None:
                    live = live_of[r.topic] = available(leaders)
                if not live:
                    keep.append(r)
                    continue
                partition = live[randrange(len(live))] if len(live) > 1 else live[0]
            else:
                partition = choose_partition(r.key, leaders, r.avoid)
                if partition is None:
                    keep.append(r)
                    continue
            r.partition = partition
            placed.append(((r.topic, partition), r))
        with self._lock:
            if self.abandoned:
                return
            self._unassigned.extendleft(reversed(keep))
            for key, r in placed:
                acc = self._parts.get(key)
                if acc is None:
                    acc = self._parts[key] = _Accumulator()
                acc.records.append(r)
                acc.bytes += len(r.value) + HEADER_SIZE
        for r, error in failed:
            self._fail([r], error)

    def _cut(self, now: float, flush: bool) -> list[Batch]:
        batches = []
        leaders_of: dict[str, dict[int, int]] = {}
        with self._lock:
            for (topic, partition), acc in self._parts.items():
                if not acc.records or acc.not_before > now:
                    continue
                if topic not in leaders_of:
                    leaders_of[topic] = self.metadata.partitions(topic) or {}
                leader = leaders_of[topic].get(partition, -1)
                if leader < 0:
                    continue
                while acc.records and (
                    flush or len(acc.records) >= self.batch_size or acc.bytes >= self.batch_bytes
                    or now - acc.records[0].enqueued >= self.linger
                ):
                    records, size = [], 0
                    while acc.records and len(records) < self.batch_size and (not records or size < self.batch_bytes):
                        r = acc.records.popleft()
                        records.append(r)
                        size += len(r.value) + HEADER_SIZE
                    acc.bytes -= size
                    batches.append(Batch(topic, partition, records, leader=leader))
            self._in_flight = batches
        return batches

    def _expire(self, now: float) -> None:
        limit = now - self.delivery_timeout
        expired: list[ProducerRecord] = []
        with self._lock:
            while self._unassigned and self._unassigned[0].enqueued < limit:
                expired.append(self._unassigned.popleft())
            if any(r.enqueued < limit for r in self._unassigned):
                expired += [r for r in self._unassigned if r.enqueued < limit]
                self._unassigned = deque(r for r in self._unassigned if r.enqueued >= limit)
            for acc in self._parts.values():
                while acc.records and acc.records[0].enqueued < limit:
                    r = acc.records.popleft()
                    acc.bytes -= len(r.value) + HEADER_SIZE
                    expired.append(r)
        if expired:
            self._fail(expired, PartitionUnavailable(
                f"not delivered within {self.delivery_timeout:g}s: no live leader for the partition, "
                "or every attempt failed"))

    def _sort(self, batches: list[Batch]) -> None:
        now = time.monotonic()
        refreshed: set[str] = set()
        for batch in batches:
            if batch.error is None:
                if self.track_offsets:
                    self._set_offsets(batch)
                for r in batch.records:
                    r.done = True
                self.on_delivered(batch)
                continue
            error = batch.error
            retry = _retriable(error) or (isinstance(error, UnknownPartition) and not batch.records[0].fixed)
            if retry and batch.topic not in refreshed:
                refreshed.add(batch.topic)
                self.metadata.refresh(batch.topic)
            logger.info("produce to %s-%d failed (%s: %s)%s", batch.topic, batch.partition, type(error).__name__,
                        error, "; retrying" if retry else "")
            give_up = [r for r in batch.records if not retry or r.attempts >= self.retries]
            again = [r for r in batch.records if retry and r.attempts < self.retries]
            for r in again:
                r.attempts += 1
                r.not_before = now + self.retry_backoff
            with self._lock:
                movable = [r for r in again if not r.fixed and r.key is None]
                for r in movable:
                    r.avoid, r.partition = r.partition, None
                self._unassigned.extend(movable)
                staying = [r for r in again if r.fixed or r.key is not None]
                if staying:
                    acc = self._parts.setdefault((batch.topic, batch.partition), _Accumulator())
                    acc.records.extendleft(reversed(staying))
                    acc.bytes += sum(len(r.value) + HEADER_SIZE for r in staying)
                    acc.not_before = now + self.retry_backoff
            self._fail(give_up, error)

    def _set_offsets(self, batch: Batch) -> None:
        offset = batch.base_offset if batch.base_offset is not None else -1
        for r in batch.records:
            r.offset = offset
            if offset >= 0 and self.codec is Codec.NONE:
                offset += HEADER_SIZE + len(r.value) + (len(r.key) if r.key is not None else 0)

    def _fail(self, records: list[ProducerRecord], error: BaseException) -> None:
        if not records:
            return
        for r in records:
            r.error = error
            r.done = True
        self.on_failed(records)

    def _next_wake(self, now: float, flush: bool) -> float:
        """Records still held after a round wait for a linger to end, a back-off to
        end, or a leader to come back (checked every `retry_backoff`)."""
        wake = 1.0
        with self._lock:
            if self._unassigned:
                earliest = min(r.not_before for r in self._unassigned)
                wake = min(wake, earliest - now if earliest > now else self.retry_backoff)
            for acc in self._parts.values():
                if acc.records:
                    due = max(acc.not_before, acc.records[0].enqueued + (0 if flush else self.linger))
                    wake = min(wake, due - now if due > now else self.retry_backoff)
        return max(wake, 0.001)
