"""A consumer-group stream: the iterator a user reads messages from.

The fetcher puts `Chunk`s (messages of one partition, in order, as columns) on the
stream's queue; the iterator hands their messages out one by one, `next_batch` the rest
of a chunk at once. Handing out is what marks messages consumed: the `next_offset` of
the last one becomes the offset the group will commit for the partition.
A chunk from before the latest rebalance (an older `generation`) is dropped unread, so
a partition that moved to another consumer is never delivered by both after the move.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from broker.client.errors import ConsumerTimeout
from broker.common.columns import MessageColumns, empty_columns


@dataclass(frozen=True, slots=True)
class ConsumedMessage:
    """A message with where it came from; `headers` as `Message.headers` (a Kafka
    record's, empty for a native message)."""

    topic: str
    partition: int
    offset: int
    next_offset: int
    timestamp: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class ConsumedBatch:
    """The messages of one partition a stream handed out at once (`next_batch`):
    `columns` holds them (`broker.common.columns.MessageColumns`), `next_offset` is
    what the group commits for the partition once they are processed."""

    topic: str
    partition: int
    columns: MessageColumns

    @property
    def next_offset(self) -> int:
        return self.columns.next_offset

    def __len__(self) -> int:
        return len(self.columns)


@dataclass(frozen=True)
class Chunk:
    generation: int
    topic: str
    partition: int
    columns: MessageColumns
    error: BaseException | None = None  # raised by the iterator (e.g. OffsetOutOfRange with reset "error")


CLOSED = Chunk(-1, "", -1, empty_columns(0))


class MessageStream:
    """Iterates messages forever (blocking until data arrives), one at a time or, with
    `next_batch`/`batches`, a fetched chunk at a time. With a `timeout` (seconds),
    raises `ConsumerTimeout` when nothing arrives for that long; iterating again
    continues where it stopped. Ends (StopIteration) when the group is closed.

    `hand_out(chunk, next_offset)` is the group's callback: it records the consumed
    offset and returns False when the chunk is stale.
    """

    def __init__(self, stream_id: str, topic: str, hand_out: Callable[[Chunk, int], bool],
                 timeout: float | None = None, on_take: Callable[[], None] | None = None) -> None:
        self.stream_id = stream_id
        self.topic = topic
        self.timeout = timeout
        self.queue: queue.Queue[Chunk] = queue.Queue()
        self._hand_out = hand_out
        self._on_take = on_take
        self._chunk: Chunk | None = None
        self._keys: list[bytes | None] = []
        self._values: list[bytes] = []
        self._pos = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"MessageStream({self.stream_id})"

    def __iter__(self) -> Iterator[ConsumedMessage]:
        return self

    def __next__(self) -> ConsumedMessage:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            chunk = self._chunk
            if chunk is None:
                chunk = self._take(deadline)
                self._keys, self._values = chunk.columns.keys(), chunk.columns.values()
            i, columns = self._pos, chunk.columns
            self._pos += 1
            if self._pos == len(columns):
                self._chunk = None
            if self._hand_out(chunk, columns.next_offsets[i]):
                return ConsumedMessage(chunk.topic, chunk.partition, columns.offsets[i], columns.next_offsets[i],
                                       columns.timestamps[i], self._keys[i], self._values[i],
                                       columns.headers.get(i, ()))
            self._chunk = None  # stale: a rebalance happened since it was fetched

    def next_batch(self) -> ConsumedBatch:
        """Every message of the next fetched chunk not handed out yet, at once, without
        an object per message; blocks, times out and ends as iteration does. Handing
        the batch out moves the partition's commit position to its `next_offset`."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            chunk = self._chunk or self._take(deadline)
            columns = chunk.columns.tail(self._pos)
            self._chunk = None
            if self._hand_out(chunk, columns.next_offset):
                return ConsumedBatch(chunk.topic, chunk.partition, columns)

    def batches(self) -> Iterator[ConsumedBatch]:
        """`next_batch` until the group is closed."""
        while True:
            try:
                yield self.next_batch()
            except StopIteration:
                return

    def _take(self, deadline: float | None) -> Chunk:
        """The next chunk with messages from the queue, waiting up to `deadline`."""
        while True:
            if self._closed:
                raise StopIteration
            wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            try:
                chunk = self.queue.get(timeout=wait)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise ConsumerTimeout(f"no message on stream {self.stream_id} within {self.timeout:g}s") from None
                continue
            if self._on_take is not None:
                self._on_take()
            if chunk is CLOSED:
                self._closed = True
                raise StopIteration
            if chunk.error is not None:
                raise chunk.error
            if len(chunk.columns):
                self._chunk, self._pos = chunk, 0
                return chunk

    def pending_chunks(self) -> int:
        return self.queue.qsize()

    def clear(self) -> None:
        """Drop queued chunks (a rebalance makes them stale)."""
        try:
            while True:
                self.queue.get_nowait()
        except queue.Empty:
            pass
