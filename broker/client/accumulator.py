"""The producer's accumulator: messages grouped into per-partition batches until the
sender takes them (docs/clients.md, "Producer"; kafka-python's RecordAccumulator is the
model).

A batch is *open* while it takes messages and *ready* once it is full (`batch_size`
messages or `batch_bytes`), its oldest message is `linger` old, or a flush asks for
everything. `drain` hands the sender the ready batches whose partition has a live
leader, oldest first and never two of a partition out of order; a batch that failed
with a retriable error comes back through `retry` and waits out its back-off at the
front. The accumulator also bounds how many messages may be undelivered
(`queue_size`: block or raise) and knows when nothing is left (`flush`).

Partitions (`broker.client.partitioner`): an explicit partition, else the key's
CRC-32, else *sticky*: unkeyed messages fill one batch on a random available
partition, and the next batch picks again. One choice per batch instead of one per
message, and fuller batches at low rates (Kafka's sticky partitioner). Such a batch
is *movable*: when its leader is down, or a send of it fails, it may go to another
available partition, since none of its messages asked for one.

A batch holds its messages' keys, values and timestamps flat (`ProducerBatch.fields`):
no object a message for the cyclic GC to count.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from random import randrange
from itertools import chain, repeat
from operator import attrgetter
from typing import Callable, Collection, Iterable

from broker.client.metadata import ClusterMetadata, available
from broker.client.errors import ProducerClosed, QueueFull
from broker.client.partitioner import choose_partition
from broker.client.batch import ProducerBatch, Record, internal_batches
from broker.client.idempotence import even_shares
from broker.client.results import BatchResult, ManyFuture, RecordFuture
from broker.common.message import HEADER_SIZE

# At most this much goes into one sender round: the round's requests are written and
# answered before the next drain, and `drain` holds the lock callers append under.
DRAIN_BYTES = 4 << 20
# And at most this many batches: at batch 1, 4 MiB are 18,000 batches, and the round's
# objects (a batch, its request and outcome, ...) lived long enough for the cyclic GC
# to move them to its oldest generation, whose full collections then took half the
# producer's CPU. A round of 500 batches dies young.
DRAIN_BATCHES = 500
# The sender looks for expired batches at most this often (seconds; `expire`, also
# at most every tenth of the delivery timeout): a look at every queued batch each
# sender round was a fifth of the producer's CPU at batch 1 with 50,000 one-message
# batches queued (BENCHMARKS.md, issue 38); a look still takes 4 ms there.
EXPIRY_CHECK = 1.0
_created = attrgetter("created")
Leaders = dict[int, int]


def _created_before(batches: deque[ProducerBatch], limit: float, topics: Collection[str]) -> list[ProducerBatch]:
    """The batches created before `limit` or bound for `topics`; `min` over the queue
    runs in C, so a look that finds none, nearly every look, costs little."""
    if not topics and min(map(_created, batches), default=limit) >= limit:
        return []
    return [b for b in batches if b.created < limit or b.topic in topics]


def _within_bytes(filled: int, values: list[bytes], per_record: int, limit: int) -> tuple[list[bytes], int]:
    """The first of `values` that fill a batch holding `filled` bytes to `limit` (at
    least one, as `append` would), and their size."""
    size = 0
    for count, value in enumerate(values, 1):
        size += per_record + len(value)
        if filled + size >= limit:
            return values[:count], size
    return values, size


class RecordAccumulator:
    """Thread-safe: callers append, the sender drains. `_lock` guards everything;
    `_work` wakes the sender, `_space` wakes callers blocked on a full queue and
    flushes waiting for the last message."""

    def __init__(self, metadata: ClusterMetadata, *, batch_size: int, batch_bytes: int, linger: float,
                 queue_size: int, queue_full: str = "block", max_block: float = 60.0, exact_offsets: bool = True,
                 retry_backoff: float = 0.1, max_in_flight_per_partition: int = 0) -> None:
        self.metadata = metadata
        self.batch_size = max(1, batch_size)
        self._last_field = 3 * (self.batch_size - 1)  # a batch is full once a message's fields start here
        self.batch_bytes = batch_bytes
        self.linger = linger
        self.queue_size, self.queue_full, self.max_block = queue_size, queue_full, max_block  # back-pressure
        self._admit_at = queue_size  # `append` asks `_admit` from this many outstanding on: queue_size, 0 once closed
        self.exact_offsets = exact_offsets
        self.retry_backoff = retry_backoff
        self.max_in_flight_per_partition = max_in_flight_per_partition  # 0: no limit
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._space = threading.Condition(self._lock)
        self._open: dict[tuple[str, int], ProducerBatch] = {}  # keyed or explicitly placed messages
        self._sticky: dict[str, ProducerBatch] = {}  # unkeyed messages, per topic
        self._ready: deque[ProducerBatch] = deque()
        self._in_flight: list[ProducerBatch] = []  # the last round drained
        self._previous: list[ProducerBatch] = []  # the round before: the idempotent sender answers it late
        self._live: dict[str, list[int]] = {}  # per topic, partitions with a leader at the last drain
        self._woken, self._napping = False, False  # napping: the sender waits on `_work`, appends notify it
        self.outstanding, self._next_expiry = 0, 0.0  # messages appended and not yet settled; `expire`'s next look
        self.flushing, self.closed = 0, False  # flushing: flushes in progress (or a close), open batches ready at once

    # ------------------------------------------------------------------ appending

    def append(self, topic: str, key: bytes | None, value: bytes, timestamp: int,
               partition: int | None, future: bool = True) -> RecordFuture | None:
        """Add one message; `partition` is explicit or the key's (None: sticky); its
        future if asked for. Every `send`'s path: the lock taken by hand (a `with`
        costs twice as much)."""
        size, lock = HEADER_SIZE + len(value) if key is None else HEADER_SIZE + len(key) + len(value), self._lock
        lock.acquire()
        try:
            if self.outstanding >= self._admit_at:
                self._admit(1)
            batch = self._sticky.get(topic) if partition is None else self._open.get((topic, partition))
            opened = batch is None
            if opened:
                batch = self._new_batch(topic, partition)
            fields = batch.fields
            start, position = len(fields), batch.bytes
            fields += (key, value, timestamp)
            batch.bytes = position + size
            self.outstanding += 1
            result = (batch.result or batch.future_result()) if future else None  # under the lock (future_result)
            if start >= self._last_field or position + size >= self.batch_bytes:
                self._close(batch)
            elif opened:
                self._wake_sender()  # to time this batch's linger
        finally:
            lock.release()
        return RecordFuture(result, position, start // 3) if future else None

    def append_many(self, topic: str, values: list[bytes], timestamp: int, key: bytes | None = None,
                    partition: int | None = None) -> ManyFuture:
        """Add messages that share a key (or none) and a partition (explicit, or None:
        sticky), a whole slice per batch under one lock, with one future for the call."""
        results: list[BatchResult] = []
        done = 0
        per_record = HEADER_SIZE + (len(key) if key is not None else 0)
        while done < len(values):
            with self._lock:
                self._admit(min(self.batch_size, len(values) - done))
                batch = self._sticky.get(topic) if partition is None else self._open.get((topic, partition))
                if batch is None:
                    batch = self._new_batch(topic, partition)
                    self._wake_sender()
                take = values[done:done + self.batch_size - batch.count]
                size = per_record * len(take) + sum(map(len, take))
                if batch.bytes + size > self.batch_bytes and len(take) > 1:
                    take, size = _within_bytes(batch.bytes, take, per_record, self.batch_bytes)
                batch.fields += chain.from_iterable(zip(repeat(key), take, repeat(timestamp)))
                batch.bytes += size
                self.outstanding += len(take)
                result = batch.future_result()  # under the lock: once closed, the sender may settle it
                if batch.count >= self.batch_size or batch.bytes >= self.batch_bytes:
                    self._close(batch)
            if not results or results[-1] is not result:
                results.append(result)
            done += len(take)
        return ManyFuture(results, len(values))

    def append_internal(self, topic: str, records: Iterable[tuple[int, Record]]) -> None:
        """Add the producer's own (partition, record)s as ready batches of their own;
        they count as outstanding (a flush waits for them) but not against the queue."""
        batches = internal_batches(topic, records, self.exact_offsets)
        with self._lock:
            for batch in batches:
                self.outstanding += batch.count
                self._ready.append(batch)
            self._wake_sender()

    def _admit(self, count: int) -> None:
        """Wait (or raise) until `count` more messages fit in `queue_size`."""
        if self.closed:
            raise ProducerClosed("send after close()")
        if self.outstanding + count <= self.queue_size or self.outstanding == 0:
            return
        if self.queue_full == "raise":
            raise QueueFull(f"{self.outstanding} messages are waiting to be sent (queue_size={self.queue_size})")
        deadline = time.monotonic() + self.max_block
        while self.outstanding + count > self.queue_size and self.outstanding and not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise QueueFull(f"queue still full after blocking {self.max_block:g}s")
            self._space.wait(left)
        if self.closed:
            raise ProducerClosed("send after close()")

    def _new_batch(self, topic: str, partition: int | None) -> ProducerBatch:
        if partition is None:
            batch = ProducerBatch(topic, self._sticky_partition(topic, None), True, self.exact_offsets)
            self._sticky[topic] = batch
        else:
            batch = ProducerBatch(topic, partition, False, self.exact_offsets)
            self._open[(topic, partition)] = batch
        return batch

    def _sticky_partition(self, topic: str, avoid: int | None) -> int:
        """A random available partition (preferring not `avoid`), as the last drain saw them
        if it did; any partition while none is available — `drain` moves the batch once one is."""
        if avoid is None and (live := self._live.get(topic)):
            return live[randrange(len(live))]
        leaders = self.metadata.partitions(topic) or {0: -1}
        partition = choose_partition(None, leaders, avoid)
        return partition if partition is not None else choose_partition(None, dict.fromkeys(leaders, 0), avoid)

    def _detach(self, batch: ProducerBatch) -> None:
        """An open batch stops taking messages."""
        if batch.movable:
            if self._sticky.get(batch.topic) is batch:
                del self._sticky[batch.topic]
        elif self._open.get((batch.topic, batch.partition)) is batch:
            del self._open[(batch.topic, batch.partition)]

    def _close(self, batch: ProducerBatch) -> None:
        batch.seal()
        self._detach(batch)
        self._ready.append(batch)
        self._wake_sender()

    def _wake_sender(self) -> None:
        """Under the lock: a napping sender wakes (a busy one drains before it naps), once:
        its nap may end a GIL switch interval later, and each `notify` is Python code."""
        if self._napping:
            self._napping = False
            self._work.notify()

    # -------------------------------------------------------------------- draining

    def drain(self, now: float, leaders_of: Callable[[str], Leaders | None]) -> list[tuple[ProducerBatch, int]]:
        """Take the ready batches that can go now, with their leader's broker id.
        Lingered open batches (all of them while flushing) become ready first."""
        with self._lock:
            lingered = now - self.linger
            for batch in [*self._sticky.values(), *self._open.values()]:
                if self.flushing or batch.created <= lingered:
                    self._close(batch)
            self._woken = False
            if not self._ready:
                return []
            leaders: dict[str, Leaders] = {}
            blocked: set[tuple[str, int]] = set()
            keep: deque[ProducerBatch] = deque()
            out: list[tuple[ProducerBatch, int]] = []
            taken = 0
            per_partition: dict[tuple[str, int], int] = {}
            latest: dict[tuple[str, int], ProducerBatch] = {}  # a partition's last batch this round
            limit = self.max_in_flight_per_partition
            ready = self._ready  # taken from the front: the rest of a long queue is not walked every round
            shares = even_shares(ready, limit, DRAIN_BYTES) if limit else {}
            while ready and taken < DRAIN_BYTES and len(out) < DRAIN_BATCHES:
                batch = ready.popleft()
                if batch.topic not in leaders:
                    leaders[batch.topic] = leaders_of(batch.topic) or {}
                    self._live[batch.topic] = available(leaders[batch.topic])
                tp_leaders = leaders[batch.topic]
                leader = tp_leaders.get(batch.partition, -1)
                if batch.movable and leader < 0:
                    live = available(tp_leaders)
                    if live:
                        batch.partition = self._sticky_partition(batch.topic, batch.partition)
                        leader = tp_leaders.get(batch.partition, -1)
                key = (batch.topic, batch.partition)
                if batch.not_before > now or leader < 0 or key in blocked:
                    keep.append(batch)
                    if not batch.movable:
                        blocked.add(key)  # a later batch of the partition must not overtake it
                    continue
                if limit:  # idempotence: the broker remembers only the last `limit` batches of a partition
                    last, full = latest.get(key), per_partition.get(key, 0) >= limit
                    if last is not None and (full or last.bytes + batch.bytes <= shares.get(key, 0)) and last.can_absorb(
                            batch, self.batch_bytes):
                        last.absorb(batch)  # spread evenly over the round's batches; past them the last grows (as Kafka's)
                        taken += batch.bytes
                        continue
                    if full:
                        keep.append(batch)
                        blocked.add(key)
                        continue
                    per_partition[key] = per_partition.get(key, 0) + 1
                    latest[key] = batch
                out.append((batch, leader))
                taken += batch.bytes
            ready.extendleft(reversed(keep))
            self._previous, self._in_flight = self._in_flight, [b for b, _ in out]
            return out

    def retry(self, batches: list[ProducerBatch], now: float, unsent: list[ProducerBatch] = ()) -> None:
        """Put batches that failed with a retriable error back in front, in their
        order, to wait `retry_backoff`; a movable one will avoid its partition. Then,
        right behind them, `unsent`: drained batches held back, untouched."""
        with self._lock:
            self._ready.extendleft(reversed(unsent))
            for batch in reversed(batches):
                batch.attempts += 1
                batch.not_before = now + self.retry_backoff
                if batch.movable:
                    batch.partition = self._sticky_partition(batch.topic, batch.partition)
                self._ready.appendleft(batch)

    def expire(self, now: float, delivery_timeout: float, topics: Collection[str] = ()) -> list[ProducerBatch]:
        """Take the batches (ready or open) created more than `delivery_timeout` ago (looked
        for every EXPIRY_CHECK), and at once those of `topics` (deleted, not to be created)."""
        if now < self._next_expiry and not topics:
            return []
        self._next_expiry, limit = now + min(EXPIRY_CHECK, delivery_timeout / 10), now - delivery_timeout
        with self._lock:
            expired = _created_before(self._ready, limit, topics)
            if expired:
                self._ready = deque(b for b in self._ready if b.created >= limit and b.topic not in topics)
            for batch in [*self._sticky.values(), *self._open.values()]:
                if batch.created < limit or batch.topic in topics:
                    self._detach(batch)
                    expired.append(batch)
            return expired

    def claim(self, batches: list[ProducerBatch]) -> list[ProducerBatch]:
        """Take the right to settle batches, once each: those not taken yet (close()
        may have given up on some while the sender still held them)."""
        with self._lock:
            mine = [b for b in batches if not b.finished]
            for batch in mine:
                batch.finished = True
            return mine

    def release(self, batches: list[ProducerBatch]) -> None:
        """Settled batches' messages leave the queue (blocked senders and flushes wake)."""
        with self._lock:
            self.outstanding -= sum(len(b.fields) for b in batches) // 3  # `count`, without a call a batch
            self._space.notify_all()

    def abandon(self) -> list[ProducerBatch]:
        """Close: take every batch not finished yet, in flight or not."""
        with self._lock:
            self.closed, self._admit_at = True, 0
            batches = [*self._previous, *self._in_flight, *self._ready, *self._sticky.values(), *self._open.values()]
            self._previous, self._in_flight, self._ready = [], [], deque()
            self._sticky.clear()
            self._open.clear()
            self._space.notify_all()
            return [b for b in batches if not b.finished]

    # --------------------------------------------------------------------- waiting

    def begin_flush(self) -> None:
        """Until `end_flush`, open batches are ready at once, linger or not."""
        with self._lock:
            self.flushing += 1
            self._woken = True
            self._wake_sender()

    def end_flush(self) -> None:
        with self._lock:
            self.flushing -= 1

    def wake(self) -> None:
        with self._lock:
            self._woken = True
            self._wake_sender()

    def wait_for_work(self, now: float, longest: float) -> None:
        """The sender's nap: until a batch is ready or opened, a linger or back-off
        ends, `wake()`, or `longest` seconds."""
        with self._lock:
            if self._woken:
                return
            due = now + longest
            for batch in self._ready:  # waiting for its back-off to end, or for a leader
                due = min(due, batch.not_before if batch.not_before > now else now + self.retry_backoff)
            for batch in [*self._sticky.values(), *self._open.values()]:
                due = min(due, batch.created + self.linger)
            if due > now:
                self._napping = True  # left True if the wait raised: callers then notify for nothing
                self._work.wait(due - now)
                self._napping = False

    def wait_until_idle(self, deadline: float, busy: Callable[[], bool] = lambda: False) -> bool:
        """A flush's wait: until nothing is outstanding and `busy()` is false, or the
        deadline. True when idle."""
        with self._lock:
            while self.outstanding or busy():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._space.wait(left)
            return True

    def notify_idle_waiters(self, change: Callable[[], None]) -> None:
        """Run `change` (what a flush's `busy` reads) under the lock, then wake flushes."""
        with self._lock:
            change()
            self._space.notify_all()
