"""Byte budgets and back-pressure: how much a connection, and all of them together, may
buffer before the broker stops reading (docs/protocol.md, "Bad input" and
"Back-pressure").

Pure bookkeeping, no sockets: the server asks `ConnectionLimits.may_read` after every
change and pauses or resumes the transport accordingly; `RequestPool` hands out the
broker-wide budget for large frames. Growth is never the answer to a greedy client:
the broker stops reading from it, and TCP pushes back on the client.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable


class RequestPool:
    """The broker-wide budget `queued.max.request.bytes` for buffered request frames and
    unsent answers.

    Large frames reserve their whole size before their body is read (`try_reserve`);
    a frame is admitted when it fits, or alone when nothing else is reserved, so a frame
    up to `socket.request.max.bytes` can always make progress and memory stays below
    max(bound, one frame) + the small frames' scratch buffers. Connections that could
    not reserve wait in FIFO order and are woken by `release`. Unsent answers are
    counted (`set_unsent`) so the server can stop reading from connections that hold
    answers while the broker as a whole is over its bound.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reserved = 0  # bytes of large frames being read or waiting to be handled
        self.unsent = 0  # bytes of answers written to transports but not yet to sockets
        self.over = False  # used > limit, kept current so the per-frame check is one load
        self._unsent_by_owner: dict[object, int] = {}
        self._waiters: collections.OrderedDict[object, Callable[[], None]] = collections.OrderedDict()

    @property
    def used(self) -> int:
        return self.reserved + self.unsent

    def try_reserve(self, owner: object, size: int, wake: Callable[[], None]) -> bool:
        """Reserve `size` bytes, or queue `wake` to be called when it may be tried again.
        Waiters are served in order: a newcomer may not overtake one already waiting."""
        if (not self._waiters or next(iter(self._waiters)) is owner) and (
            self.reserved == 0 or self.used + size <= self.limit
        ):
            self._waiters.pop(owner, None)
            self.reserved += size
            self.over = self.used > self.limit
            return True
        self._waiters[owner] = wake
        return False

    def release(self, size: int) -> None:
        self.reserved -= size
        self.over = self.used > self.limit
        self.wake_first()

    def set_unsent(self, owner: object, size: int) -> None:
        """Record how many answer bytes `owner` has buffered (0 forgets it)."""
        before = self._unsent_by_owner.pop(owner, 0)
        if size:
            self._unsent_by_owner[owner] = size
        self.unsent += size - before
        self.over = self.used > self.limit
        if size < before:
            self.wake_first()

    def forget(self, owner: object) -> None:
        """A connection went away: drop its unsent bytes and its place in the queue."""
        self._waiters.pop(owner, None)
        self.set_unsent(owner, 0)
        self.wake_first()

    def wake_first(self) -> None:
        if self._waiters:
            next(iter(self._waiters.values()))()

    @property
    def waiting(self) -> int:
        return len(self._waiters)


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-connection bounds: `max_in_flight` requests (answered or not yet written
    immediate answers included) and `max_unsent` bytes of answers not yet accepted by
    the socket (`socket.send.buffer.max.bytes`)."""

    max_in_flight: int
    max_unsent: int

    def may_read(self, in_flight: int, unsent: int, pool_over: bool, waiting_for_pool: bool) -> bool:
        """Whether to keep reading from a connection. While the broker-wide budget is
        exceeded, a connection that still holds unsent answers stops too: it is the
        one whose client is not reading."""
        if waiting_for_pool or in_flight >= self.max_in_flight or unsent >= self.max_unsent:
            return False
        return not (pool_over and unsent > 0)
