"""Monitoring events (docs/clients.md, "Monitoring events"), the producer's side:
`AuditCounter` counts the messages a producer sent per topic and window, and turns the
counts into events.

The producer calls `record()` for every batch the broker accepted; `events()` turns the
windows that changed since the last call into JSON events for the monitoring topic
(`_logbus_audit`)::

    {"tier": "producer", "server": host, "producer_id": uuid, "topic": t,
     "window_start": ms, "window_end": ms, "count": n, "bytes": b, "seq": s, "published_ms": ms}

Counts are *cumulative* for the producer's lifetime, so an event can be published any
number of times (every window, on flush, on close) and a reader keeps only the latest
per `(producer_id, topic, window_start)` — the one with the highest `seq`. `bytes` are
the bytes of keys and values (what the user sent, not the framing). Windows are of the
message timestamp, not of the send time, so a late message counts in its own window.
Messages of the monitoring topic itself are never counted.

The reader of these events is `broker.client.monitoring`.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from dataclasses import dataclass

from broker.common.message import now_ms

logger = logging.getLogger(__name__)

AUDIT_TOPIC = "_logbus_audit"
DEFAULT_WINDOW_MS = 600_000  # 10 minutes


@dataclass
class WindowCount:
    count: int = 0
    bytes: int = 0


class AuditCounter:
    """Counts of one producer. `_lock` guards `_counts`, `_dirty` and `_seq`: the
    producer's sender thread records while a flush in another thread publishes."""

    def __init__(self, producer_id: str, window_ms: int = DEFAULT_WINDOW_MS, audit_topic: str = AUDIT_TOPIC,
                 server: str | None = None) -> None:
        if window_ms <= 0:
            raise ValueError("audit_window_ms must be > 0")
        self.producer_id = producer_id
        self.window_ms = window_ms
        self.audit_topic = audit_topic
        self.server = server or socket.gethostname()
        self._counts: dict[tuple[str, int], WindowCount] = {}
        self._dirty: set[tuple[str, int]] = set()
        self._seq = 0
        self._lock = threading.Lock()
        self._next_publish = self._window_end(now_ms())

    def _window_end(self, ms: int) -> int:
        return ms - ms % self.window_ms + self.window_ms

    def record(self, topic: str, messages) -> None:
        """Count delivered messages, given as objects with `key`, `value`, `timestamp`."""
        if topic == self.audit_topic:
            return
        window = self.window_ms
        sums: dict[int, list[int]] = {}
        for m in messages:
            start = m.timestamp - m.timestamp % window
            entry = sums.get(start)
            if entry is None:
                entry = sums[start] = [0, 0]
            entry[0] += 1
            entry[1] += len(m.value) + (len(m.key) if m.key is not None else 0)
        with self._lock:
            for start, (count, size) in sums.items():
                key = (topic, start)
                total = self._counts.get(key)
                if total is None:
                    total = self._counts[key] = WindowCount()
                total.count += count
                total.bytes += size
                self._dirty.add(key)

    def due(self, now: int | None = None) -> bool:
        """True once per window boundary: time to publish what changed."""
        return (now_ms() if now is None else now) >= self._next_publish and bool(self._dirty)

    def pending(self) -> bool:
        """Counts changed since the last `events()` (a flush must publish again)."""
        return bool(self._dirty)

    def events(self) -> list[tuple[bytes, bytes]]:
        """(key, JSON value) of an event for every window changed since the last call."""
        now = now_ms()
        with self._lock:
            self._next_publish = self._window_end(now)
            changed = sorted(self._dirty)
            self._dirty.clear()
            out = []
            for topic, start in changed:
                self._seq += 1
                total = self._counts[(topic, start)]
                event = {
                    "tier": "producer", "server": self.server, "producer_id": self.producer_id, "topic": topic,
                    "window_start": start, "window_end": start + self.window_ms, "count": total.count,
                    "bytes": total.bytes, "seq": self._seq, "published_ms": now,
                }
                key = f"{self.producer_id}:{topic}:{start}".encode()
                out.append((key, json.dumps(event, separators=(",", ":")).encode()))
        return out
