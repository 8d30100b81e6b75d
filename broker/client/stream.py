"""A consumer-group stream: the iterator a user reads messages from.

The fetcher puts `Chunk`s (messages of one partition, in order) on the stream's queue;
the iterator hands their messages out one by one. Handing a message out is what marks
it consumed: `next_offset` becomes the offset the group will commit for the partition.
A chunk from before the latest rebalance (an older `generation`) is dropped unread, so
a partition that moved to another consumer is never delivered by both after the move.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from broker.client.errors import ConsumerTimeout
from broker.common.message import Message


@dataclass(frozen=True, slots=True)
class ConsumedMessage:
    """A message with where it came from."""

    topic: str
    partition: int
    offset: int
    next_offset: int
    timestamp: int
    key: bytes | None
    value: bytes


@dataclass(frozen=True)
class Chunk:
    generation: int
    topic: str
    partition: int
    messages: list[Message]
    error: BaseException | None = None  # raised by the iterator (e.g. OffsetOutOfRange with reset "error")


CLOSED = Chunk(-1, "", -1, [])


class MessageStream:
    """Iterates messages forever (blocking until data arrives). With a `timeout`
    (seconds), raises `ConsumerTimeout` when nothing arrives for that long; iterating
    again continues where it stopped. Ends (StopIteration) when the group is closed.

    `hand_out(chunk, message)` is the group's callback: it records the consumed offset
    and returns False when the chunk is stale.
    """

    def __init__(self, stream_id: str, topic: str, hand_out: Callable[[Chunk, Message], bool],
                 timeout: float | None = None, on_take: Callable[[], None] | None = None) -> None:
        self.stream_id = stream_id
        self.topic = topic
        self.timeout = timeout
        self.queue: queue.Queue[Chunk] = queue.Queue()
        self._hand_out = hand_out
        self._on_take = on_take
        self._chunk: Chunk | None = None
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
            if chunk is not None and self._pos < len(chunk.messages):
                m = chunk.messages[self._pos]
                self._pos += 1
                if self._hand_out(chunk, m):
                    return ConsumedMessage(chunk.topic, chunk.partition, m.offset, m.next_offset, m.timestamp, m.key,
                                           m.value)
                self._chunk = None  # stale: a rebalance happened since it was fetched
                continue
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
            self._chunk, self._pos = chunk, 0

    def pending_chunks(self) -> int:
        return self.queue.qsize()

    def clear(self) -> None:
        """Drop queued chunks (a rebalance makes them stale)."""
        try:
            while True:
                self.queue.get_nowait()
        except queue.Empty:
            pass
