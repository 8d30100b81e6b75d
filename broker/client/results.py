"""What the producer gives back: futures that resolve to where messages landed or to
why they did not, the delivered-batch notice, and the delivery report.

The sender resolves one `BatchResult` per produce batch, once. Each `send` returns a
`RecordFuture` — a view of its batch's result plus the message's byte position in
the batch — so a batch of 50 messages costs one event, not 50 (kafka-python's
FutureProduceResult / FutureRecordMetadata split). `send_many` returns one
`ManyFuture` over the batches that hold its messages.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from broker.client.errors import ProduceError


@dataclass(frozen=True)
class RecordMetadata:
    """Where a message landed. `offset` is -1 with acks=0; inside a compressed batch
    it is the offset of the wrapper entry."""

    topic: str
    partition: int
    offset: int


class DeliveredBatch(NamedTuple):
    """What `on_delivery` is told about each delivered batch: `count` messages of
    `bytes` bytes (keys and values) at `base_offset` (-1 with acks=0); `created` is the
    `time.monotonic()` of its first message. A tuple made in C (`delivered_batch`): at
    batch 1 the sender makes one a message, and a frozen dataclass's `__init__` (a
    `setattr` a field) cost as much as the rest of settling it."""

    topic: str
    partition: int
    base_offset: int
    count: int
    bytes: int
    created: float


delivered_batch = partial(tuple.__new__, DeliveredBatch)


@dataclass(frozen=True)
class FailedSend:
    """A message the producer gave up on, and why."""

    topic: str
    key: bytes | None
    value: bytes
    timestamp: int
    partition: int | None
    error: BaseException


@dataclass
class DeliveryReport:
    """What happened to the messages since the previous report.

    `delivered`: acknowledged by the broker (with acks=0: written to the socket);
    `failed`: given up, with errors; `pending`: still queued or in flight when the
    report was made (only a `flush` that timed out has pending messages).
    """

    delivered: int = 0
    failed: list[FailedSend] = field(default_factory=list)
    pending: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed and not self.pending

    def __str__(self) -> str:
        return f"{self.delivered} delivered, {len(self.failed)} failed, {self.pending} pending"


class ReportBook:
    """The counts and failures since the last report; the sender writes, `flush` and
    `close` take."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._report = DeliveryReport()

    def delivered(self, count: int) -> None:
        with self._lock:
            self._report.delivered += count

    def failed(self, failures: list[FailedSend]) -> None:
        with self._lock:
            self._report.failed.extend(failures)

    def take(self, pending: int) -> DeliveryReport:
        with self._lock:
            report, self._report = self._report, DeliveryReport()
        report.pending = pending
        return report


def produce_error(topic: str, error: BaseException) -> ProduceError:
    """The error a future raises: `cause` is the broker's error (its class given by
    the wire error code) or the client's (connection lost, timed out)."""
    failure = ProduceError(f"could not send to {topic}: {type(error).__name__}: {error}", error)
    failure.__cause__ = error
    return failure


# Guards the making of a BatchResult's `_event`: an Event is made only for a batch someone
# waits on (making one costs more than the rest of a batch's bookkeeping).
_WAITERS = threading.Lock()


class BatchResult:
    """The outcome of one produce batch, set once: the partition it went to and its
    base offset (-1 with acks=0), or the error. `exact` says whether the batch went as
    plain entries (a message's offset is `base_offset` plus its byte position in the
    batch) or as one wrapper (plus its index: docs/architecture.md, "Offsets")."""

    __slots__ = ("topic", "exact", "partition", "base_offset", "error", "_done", "_event", "shift_records",
                 "shift_bytes")

    def __init__(self, topic: str, exact: bool) -> None:
        self.topic = topic
        self.exact = exact
        self.partition = -1
        self.base_offset = -1
        self.shift_records = self.shift_bytes = 0  # what precedes its messages in the batch that absorbed it
        self.error: BaseException | None = None
        self._done = False
        self._event: threading.Event | None = None

    def succeed(self, partition: int, base_offset: int) -> None:
        self.partition, self.base_offset = partition, base_offset
        self._set()

    def fail(self, partition: int | None, error: BaseException) -> None:
        self.partition, self.error = (-1 if partition is None else partition), error
        self._set()

    def _set(self) -> None:
        """Without a lock (the sender settles every batch): `_done` is written before
        `_event` is read, and `wait` writes `_event` before it reads `_done` again, so
        either the setter sees the event or the waiter sees the batch done (the GIL
        orders the two threads' steps)."""
        self._done = True
        event = self._event
        if event is not None:
            event.set()

    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None) -> None:
        if self._done:
            return
        with _WAITERS:
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if self._done:  # set before the event existed: its setter may not have seen it
            return
        if not event.wait(timeout):
            raise TimeoutError(f"no outcome for a batch to {self.topic} within {timeout:g}s")


class RecordFuture:
    """One message's outcome: `result()` is its `RecordMetadata`, or raises
    `ProduceError` (whose `cause` is the broker's error); `TimeoutError` when
    `timeout` passes first."""

    __slots__ = ("_batch", "_position", "_index")

    def __init__(self, batch: BatchResult, position: int, index: int = 0) -> None:
        self._batch = batch
        self._position = position  # bytes before this message in its batch
        self._index = index  # messages before it in its batch

    @classmethod
    def failed(cls, topic: str, error: BaseException) -> "RecordFuture":
        """A message refused before it reached a batch (unknown partition, topic that
        cannot be created)."""
        result = BatchResult(topic, False)
        result.fail(None, error)
        return cls(result, 0)

    @property
    def batch(self) -> BatchResult:
        return self._batch

    def done(self) -> bool:
        return self._batch.done()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error this message failed with, or None once it is delivered."""
        self._batch.wait(timeout)
        return self._batch.error

    def result(self, timeout: float | None = None) -> RecordMetadata:
        batch = self._batch
        batch.wait(timeout)
        if batch.error is not None:
            raise produce_error(batch.topic, batch.error)
        offset = batch.base_offset
        if offset >= 0:
            offset += batch.shift_bytes + self._position if batch.exact else batch.shift_records + self._index
        return RecordMetadata(batch.topic, batch.partition, offset)


class ManyFuture:
    """The outcome of one `send_many` call: `result()` is the number of messages once
    every batch holding them is delivered, or raises `ProduceError` for the first
    batch that failed (the report of `flush`/`close` lists each failed message)."""

    __slots__ = ("_batches", "count")

    def __init__(self, batches: list[BatchResult], count: int) -> None:
        self._batches = batches
        self.count = count

    def done(self) -> bool:
        return all(b.done() for b in self._batches)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for batch in self._batches:
            batch.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if batch.error is not None:
                return batch.error
        return None

    def result(self, timeout: float | None = None) -> int:
        error = self.exception(timeout)
        if error is not None:
            raise produce_error(self._batches[0].topic, error)
        return self.count
