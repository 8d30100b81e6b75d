"""acks=0 plain sets held to the end of the socket read that brought them, then
appended as one set per log (docs/architecture.md, "Deferred acks=0 appends").

At batch 1 every message is one PRODUCE request, and an append per request (the log's
lock, roll check, index, tally, flusher and replica notice) was a third of the broker's
CPU for it. Each request is still decoded, authorized and validated on its own, so a
refusal names its request; only the append is shared. Nothing waits for an acks=0
append's offsets, and a set of whole entries followed by another is one valid set, so
the log holds the same bytes in the same order as with one append each.

What is held is appended before anything could see the log without it: at the end of
the read (`RequestHandler.write_unwritten`), before any other native append to any log (an
acknowledged request's offsets come after the sets sent before it), and — should a read
end without that call — at the event loop's next turn. Consumers see only flushed bytes
or the high watermark, which no request in the same read can move. A log whose
partition this broker stopped leading in between gets nothing: its sets are dropped
with a warning, as acks=0 sets sent to a follower are."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from broker.common.errors import LogbusError
from broker.common.message import ScanResult
from broker.server.log.index import INTERVAL, LONG_SET
from broker.server.log.log import Log

logger = logging.getLogger(__name__)

# Sets up to the index's interval are held: for a larger set the append is a small part
# of its cost (its validation walks more entries), and joining it to others is a copy.
HOLD_SET_BYTES = INTERVAL
# A log's held sets are appended once they would exceed this: the index walks a longer
# appended set for points inside it, which costs more than the appends it saves.
HOLD_MAX_BYTES = LONG_SET


class HeldSets:
    """One log's held sets and what `Log.append` needs to know of them together."""

    __slots__ = ("topic", "partition", "sets", "size", "count", "records", "low", "high", "record_low", "record_high")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.sets: list[bytes | memoryview] = []
        self.size = self.count = self.records = 0
        self.low = self.record_low = 1 << 62
        self.high = self.record_high = -(1 << 62)

    def add(self, messages: bytes | memoryview, scanned: ScanResult) -> None:
        self.sets.append(messages)
        self.size += len(messages)
        self.count += scanned.count
        self.records += scanned.records
        self.low, self.high = min(self.low, scanned.min_timestamp), max(self.high, scanned.max_timestamp)
        low, high = scanned.record_times
        self.record_low, self.record_high = min(self.record_low, low), max(self.record_high, high)


class DeferredAppends:
    """The held sets of every log, in the order their logs were first touched.
    `append(log, held)` appends one log's sets; it is the handler's."""

    def __init__(self, append: Callable[[Log, HeldSets], None]) -> None:
        self._append = append
        self.held: dict[Log, HeldSets] = {}  # a plain dict: its truth is the check on every append

    def hold(self, log: Log, topic: str, partition: int, messages: bytes | memoryview, scanned: ScanResult) -> None:
        """Hold a validated plain acks=0 set of at most HOLD_SET_BYTES."""
        held = self.held.get(log)
        if held is not None and held.size + len(messages) > HOLD_MAX_BYTES:
            del self.held[log]
            self._append_logged(log, held)
            held = None
        if held is None:
            if not self.held:
                asyncio.get_running_loop().call_soon(self.append_all)  # a read that ends without `append_all`
            held = self.held[log] = HeldSets(topic, partition)
        held.add(messages, scanned)

    def append_all(self) -> None:
        """Append every log's held sets, one append per log."""
        while self.held:
            log, held = next(iter(self.held.items()))
            del self.held[log]
            self._append_logged(log, held)

    def _append_logged(self, log: Log, held: HeldSets) -> None:
        """A failure is a log line (the sets were acks=0, as in `Answers.refused`) and
        does not keep the other logs' sets back."""
        try:
            self._append(log, held)
        except LogbusError as exc:
            logger.warning("%d acks=0 request(s) to %s-%d not appended: %s", len(held.sets), held.topic,
                           held.partition, exc)
