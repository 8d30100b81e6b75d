"""A producer batch: messages bound for one partition, in send order, and what the
sender and idempotence need to know of it (docs/clients.md, "Producer"). The
`RecordAccumulator` (accumulator.py) fills and hands them over.

A batch keeps its messages flat, key, value and timestamp of each in turn, in one list
(`fields`), not as a tuple a message. A tuple is an object the cyclic GC counts while
it lives; a queue of them made the collector run once every 700 messages and walk the
whole heap every few thousand: 12-14% of the producer's CPU at batch 50 (BENCHMARKS.md,
issue 38). The tuple `fields += (key, value, timestamp)` makes is freed at once, and
uncounted with it."""

from __future__ import annotations

import time
from typing import Iterable, Iterator, Sequence

from broker.client.results import BatchResult
from broker.common.message import HEADER_SIZE

Record = tuple  # (key: bytes | None, value: bytes, timestamp: int)


class ProducerBatch:
    """Messages bound for one partition, in send order. `internal` batches carry the
    producer's own monitoring events."""

    __slots__ = ("topic", "partition", "fields", "bytes", "created", "movable", "internal", "attempts",
                 "not_before", "finished", "exact", "result", "riders", "producer_id", "epoch", "sequence")

    def __init__(self, topic: str, partition: int, movable: bool, exact: bool, internal: bool = False) -> None:
        self.topic = topic
        self.partition = partition
        self.fields: list | tuple = []  # key, value, timestamp of each message, flat; a tuple once sealed with one
        self.bytes = 0  # encoded size without compression: HEADER_SIZE + key + value per message
        self.created = time.monotonic()
        self.movable, self.internal = movable, internal
        self.attempts, self.not_before, self.finished = 0, 0.0, False
        self.exact = exact
        # Made for the first future (`future_result`): a batch only `produce` filled has
        # none. At batch 1 the batches queued behind a busy sender live long enough for
        # the cyclic GC's full collections, which each object a batch holds makes dearer.
        self.result: BatchResult | None = None
        self.riders: tuple[BatchResult, ...] = ()  # results of batches merged into this one (`absorb`); no list
        self.producer_id: int | None = None  # idempotence: the identity it was first sent with
        self.epoch = 0
        self.sequence: int | None = None

    def __repr__(self) -> str:
        return f"<batch {self.topic}-{self.partition} of {self.count}>"

    @property
    def count(self) -> int:
        """How many messages the batch holds."""
        return len(self.fields) // 3

    def messages(self) -> Iterator[Record] | tuple[Record]:
        """The (key, value, timestamp) of each message, in order: for one message the
        sealed fields themselves, else made one at a time (`zip` reuses its tuple)."""
        fields = self.fields
        if len(fields) == 3:  # batch 1's every batch
            return (fields if type(fields) is tuple else tuple(fields),)
        it = iter(fields)
        return zip(it, it, it)

    def timestamps(self) -> Sequence[int]:
        """Each message's timestamp, in order (one slice of the fields)."""
        return self.fields[2::3]

    def seal(self) -> None:
        """The batch stops taking messages. One message's list becomes a tuple, which the
        cyclic GC stops tracking once it has seen it: at batch 1 the batches queued
        behind the sender were half its full collections' work."""
        if len(self.fields) == 3:
            self.fields = tuple(self.fields)

    def future_result(self) -> BatchResult:
        """The result futures of this batch's messages view. Made under the accumulator's
        lock while the batch is open: once closed, the sender may settle it any time."""
        if self.result is None:
            self.result = BatchResult(self.topic, self.exact)
        return self.result

    @property
    def results(self) -> list[BatchResult]:
        """Every result this batch settles: its own, if a future asked for it, and those
        of the batches it absorbed."""
        return [*self.riders] if self.result is None else [self.result, *self.riders]

    def can_absorb(self, other: "ProducerBatch", max_bytes: int) -> bool:
        """`other` may join this batch: same partition and kind, neither sent yet (no
        sequence), and the sum within `max_bytes`."""
        return (other.topic == self.topic and other.partition == self.partition and other.internal == self.internal
                and self.sequence is None and other.sequence is None and not other.attempts
                and self.bytes + other.bytes <= max_bytes)

    def absorb(self, other: "ProducerBatch") -> None:
        """Take `other`'s messages (after this batch's) and the duty to settle its result;
        its messages' offsets now count from this batch's start."""
        for result in other.results:
            result.shift_records += self.count
            result.shift_bytes += self.bytes
        if type(self.fields) is tuple:
            self.fields = list(self.fields)
        self.fields += other.fields
        self.bytes += other.bytes
        self.riders = (*self.riders, *other.results)
        self.movable = self.movable and other.movable


def record_size(key: bytes | None, value: bytes) -> int:
    return HEADER_SIZE + len(value) + (len(key) if key is not None else 0)


def internal_batches(topic: str, records: Iterable[tuple[int, Record]], exact: bool) -> list[ProducerBatch]:
    """The producer's own (partition, record)s as `internal` batches, one per partition."""
    batches: dict[int, ProducerBatch] = {}
    for partition, (key, value, timestamp) in records:
        batch = batches.get(partition)
        if batch is None:
            batch = batches[partition] = ProducerBatch(topic, partition, False, exact, internal=True)
        batch.fields += (key, value, timestamp)
        batch.bytes += record_size(key, value)
    return list(batches.values())
