"""Monitoring events (docs/clients.md, "Monitoring events"): what each tier of the
pipeline counted per topic and window, the auditing system's ground truth (the Kafka
paper's name for them). Both sides live here — `MonitoringCounter` writes them,
`read_events` and `sum_counts` read them — so the event format has one home.

A tier is a stage a message passes: `producer` (what a producer delivered) and `mirror`
(what a mirror copied from a `source` cluster into this one). A counter is told its tier
(and source); `record()` counts delivered messages and `events()` turns the windows
that changed since the last call into JSON events for the monitoring topic
(`_logbus_monitoring`)::

    {"tier": "producer", "server": host, "producer_id": uuid, "topic": t,
     "window_start": ms, "window_end": ms, "count": n, "bytes": b, "seq": s, "published_ms": ms}

plus `"source": name` in a mirror's events. Counts are *cumulative* for the counter's
lifetime, so an event can be published any number of times (every window, on flush, on
close) and a reader keeps only the latest per `(tier, source, producer_id, topic,
window_start)` — the one with the highest `seq`. `bytes` are the bytes of keys and
values (what the user sent, not the framing). Windows are of the message timestamp, not
of the send time, so a late message counts in its own window. Messages of the monitoring
topic itself are never counted.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from broker.client.metadata import ClusterMetadata, open_metadata
from broker.client.consumer import SimpleConsumer
from broker.client.security import OPEN, ClientSecurity
from broker.common.message import now_ms

logger = logging.getLogger(__name__)

MONITORING_TOPIC = "_logbus_monitoring"
DEFAULT_WINDOW_MS = 600_000  # 10 minutes
PRODUCER_TIER = "producer"
MIRROR_TIER = "mirror"

# (tier, source, producer_id, topic, window_start): the identity of a counter's window
EventKey = tuple[str, str | None, str, str, int]


@dataclass
class WindowCount:
    count: int = 0
    bytes: int = 0


# ----------------------------------------------------------------------------- writing


class MonitoringCounter:
    """Counts of one producer (or mirror). `_lock` guards `_counts`, `_dirty` and `_seq`:
    the producer's sender thread records while a flush in another thread publishes."""

    def __init__(self, producer_id: str, window_ms: int = DEFAULT_WINDOW_MS,
                 monitoring_topic: str = MONITORING_TOPIC, server: str | None = None,
                 tier: str = PRODUCER_TIER, source: str | None = None) -> None:
        if window_ms <= 0:
            raise ValueError("monitoring_window_ms must be > 0")
        if tier == MIRROR_TIER and not source:
            raise ValueError("a mirror's monitoring events must name their source cluster")
        self.producer_id = producer_id
        self.window_ms = window_ms
        self.monitoring_topic = monitoring_topic
        self.server = server or socket.gethostname()
        self.tier, self.source = tier, source
        self._counts: dict[tuple[str, int], WindowCount] = {}
        self._dirty: set[tuple[str, int]] = set()
        self._seq = 0
        self._lock = threading.Lock()
        self._next_publish = self._window_end(now_ms())

    def _window_end(self, ms: int) -> int:
        return ms - ms % self.window_ms + self.window_ms

    def counts(self, since_ms: int = 0) -> dict[str, list[int]]:
        """The cumulative counts of windows starting at or after `since_ms`, as
        {"topic|window_start": [count, bytes]}: what a mirror keeps in its checkpoint."""
        with self._lock:
            return {f"{topic}|{start}": [c.count, c.bytes] for (topic, start), c in self._counts.items()
                    if start >= since_ms}

    def restore(self, counts: dict[str, list[int]], seq: int) -> None:
        """Start from counts taken by `counts()` (a restarted mirror continues its
        predecessor's counters from its checkpoint) with `seq` above every event the
        predecessor may have published, so a reader ranks the new events first. The
        restored windows are due at the next `events()`: the predecessor may have died
        before publishing what its checkpoint holds."""
        with self._lock:
            for name, (count, size) in counts.items():
                topic, _, start = name.rpartition("|")
                self._counts[(topic, int(start))] = WindowCount(int(count), int(size))
                self._dirty.add((topic, int(start)))
            self._seq = max(self._seq, seq)

    def requeue(self, keys: Iterable[bytes]) -> None:
        """Make the windows of events that were not published (keys as `events()` made
        them) due again: their next event carries the counts of that moment."""
        with self._lock:
            for key in keys:
                window, _, start = key.decode().rpartition(":")
                topic = window[len(self.producer_id) + 1:]
                if (topic, int(start)) in self._counts:
                    self._dirty.add((topic, int(start)))

    def record(self, topic: str, messages) -> None:
        """Count delivered messages, given as objects with `key`, `value`, `timestamp`."""
        if topic != self.monitoring_topic:
            self._add(topic, self._windows((m.key, m.value, m.timestamp) for m in messages))

    def _windows(self, messages: Iterable[tuple[bytes | None, bytes, int]]) -> dict[int, list[int]]:
        """[count, key and value bytes] per window start of (key, value, timestamp)s."""
        window = self.window_ms
        sums: dict[int, list[int]] = {}
        for key, value, timestamp in messages:
            start = timestamp - timestamp % window
            entry = sums.get(start)
            if entry is None:
                entry = sums[start] = [0, 0]
            entry[0] += 1
            entry[1] += len(value) + (len(key) if key is not None else 0)
        return sums

    def record_batch(self, topic: str, timestamps: Sequence[int], size: int,
                     messages: Callable[[], Iterable[tuple[bytes | None, bytes, int]]]) -> None:
        """Count a delivered producer batch: its messages' `timestamps`, in order, and
        `size`, the bytes of their keys and values. A batch whose timestamps all fall in
        one window (nearly every batch) is counted without a step a message: the walk
        of `messages()`, (key, value, timestamp) each, was a third of the producer's CPU
        at batch 50 (BENCHMARKS.md, issue 38)."""
        if topic == self.monitoring_topic or not timestamps:
            return
        window = self.window_ms
        start = min(timestamps)
        start -= start % window
        if max(timestamps) < start + window:
            self._add(topic, {start: [len(timestamps), size]})
        else:
            self._add(topic, self._windows(messages()))

    def _add(self, topic: str, sums: dict[int, list[int]]) -> None:
        """Add (count, bytes) per window start to the topic's windows, which become due."""
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
        tier = {"tier": self.tier, **({"source": self.source} if self.source else {})}
        with self._lock:
            self._next_publish = self._window_end(now)
            changed = sorted(self._dirty)
            self._dirty.clear()
            out = []
            for topic, start in changed:
                self._seq += 1
                total = self._counts[(topic, start)]
                event = {
                    **tier, "server": self.server, "producer_id": self.producer_id, "topic": topic,
                    "window_start": start, "window_end": start + self.window_ms, "count": total.count,
                    "bytes": total.bytes, "seq": self._seq, "published_ms": now,
                }
                key = f"{self.producer_id}:{topic}:{start}".encode()
                out.append((key, json.dumps(event, separators=(",", ":")).encode()))
        return out


# ----------------------------------------------------------------------------- reading


def event_key(event: dict) -> EventKey:
    """The window an event reports on; events without a tier are a producer's (the
    format before tiers)."""
    return (event.get("tier", PRODUCER_TIER), event.get("source"), event["producer_id"], event["topic"],
            int(event["window_start"]))


def latest_events(events: Iterable[dict]) -> dict[EventKey, dict]:
    """The latest event per (tier, source, producer_id, topic, window_start): highest
    `seq`, then highest count (counts are cumulative, so the larger one is never older)."""
    latest: dict[EventKey, dict] = {}
    for event in events:
        key = event_key(event)
        known = latest.get(key)
        rank = (event.get("seq", 0), event["count"])
        if known is None or rank > (known.get("seq", 0), known["count"]):
            latest[key] = event
    return latest


def sum_by_source(events: Iterable[dict], tier: str) -> dict[str | None, dict[tuple[str, int], WindowCount]]:
    """Messages one tier counted per source, then per (topic, window_start), over all its
    counters (the producer tier has one source, None)."""
    totals: dict[str | None, dict[tuple[str, int], WindowCount]] = {}
    for (event_tier, source, _, topic, start), event in latest_events(events).items():
        if event_tier == tier:
            total = totals.setdefault(source, {}).setdefault((topic, start), WindowCount())
            total.count += int(event["count"])
            total.bytes += int(event.get("bytes", 0))
    return totals


def sum_counts(events: Iterable[dict], tier: str = PRODUCER_TIER) -> dict[tuple[str, int], WindowCount]:
    """Messages one tier counted per (topic, window_start), over all its counters and sources."""
    totals: dict[tuple[str, int], WindowCount] = {}
    for counts in sum_by_source(events, tier).values():
        for key, count in counts.items():
            total = totals.setdefault(key, WindowCount())
            total.count += count.count
            total.bytes += count.bytes
    return totals


def read_events(zookeeper: str | None = None, brokers: list[str] | str | None = None,
                monitoring_topic: str = MONITORING_TOPIC, metadata: ClusterMetadata | None = None,
                security: ClientSecurity = OPEN, since_ms: int | None = None) -> list[dict]:
    """Every decodable event in the monitoring topic, read from earliest to the latest
    offset at the time of the call; an absent topic has no events. With `since_ms`, each
    partition is read from the start of the segment holding that time (OFFSETS), so
    every event published at or after it is read — and usually some before it — while
    older segments are skipped: a reader of recent hours does not scan the history."""
    own = metadata is None
    metadata = metadata or open_metadata(zookeeper, brokers, security=security)
    events = []
    try:
        leaders = metadata.partitions(monitoring_topic)
        for partition in sorted(leaders or {}):
            consumer = SimpleConsumer(monitoring_topic, partition, metadata=metadata, offset="smallest", max_wait_ms=0)
            try:
                if since_ms is not None:
                    consumer.seek(max([consumer.earliest(), *consumer.offsets_before(since_ms)]))
                end = consumer.latest()
                while consumer.offset < end:
                    batch = consumer.fetch()
                    if not batch:
                        break
                    for message in batch:
                        try:
                            events.append(json.loads(message.value))
                        except ValueError:
                            logger.warning("skipping an unreadable monitoring event at %s-%d@%d",
                                           monitoring_topic, partition, message.offset)
            finally:
                consumer.close()
    finally:
        if own:
            metadata.close()
    return events


def read_producer_counts(zookeeper: str | None = None, brokers: list[str] | str | None = None,
                         monitoring_topic: str = MONITORING_TOPIC,
                         metadata: ClusterMetadata | None = None) -> dict[tuple[str, int], WindowCount]:
    """Messages produced per (topic, window_start) according to the monitoring topic."""
    return sum_counts(read_events(zookeeper, brokers, monitoring_topic, metadata))
