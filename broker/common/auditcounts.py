"""The brokers' record counts (docs/provider.md, "The audit", tier `broker`): how many
records of a partition's committed log fall in each window of their timestamp, kept in
ZooKeeper at `/logbus_audit/<topic>/<partition>` by the partition's leader
(`broker.server.audit`) and read by the audit (`broker.client.auditcounts`).

The counts are a function of the committed log prefix `[began, upto)` alone — the same
bytes on every in-sync replica — so whichever broker leads continues from `upto` on its
own copy, and a write conditional on the node's version makes each prefix counted once
whoever writes it. The node:

    {"upto": offset, "began": offset, "windows": {"<window_start>": count, ...},
     "pruned": records, "unreadable": entries, "skipped": [[start, end], ...], "kept_from": ms}

`upto` is an entry boundary: every record of an offset in `[began, upto)` is counted.
`pruned` counts the records of windows dropped because they are older than the broker's
`audit.window.retention.ms` (and of records already that old when counted), and
`kept_from` is the oldest window start still kept: the counts of earlier windows are
partial;
`unreadable` the entries that could not be decoded (passed over, never a count);
`skipped` the offset ranges retention deleted before they were counted (a leader that
could not count for longer than the log's retention).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from broker.common.message import HEADER_SIZE, first_entry_size
from broker.common.records import record_timestamps
from broker.common.zklayout import AUDIT

WINDOW_MS = 600_000  # the monitoring events' windows (broker.client.monitoring.DEFAULT_WINDOW_MS)


def audit_topic_path(topic: str) -> str:
    return f"{AUDIT}/{topic}"


def audit_path(topic: str, partition: int) -> str:
    return f"{AUDIT}/{topic}/{partition}"


@dataclass
class PartitionCounts:
    """One partition's counts: records per window start (ms) of the offsets in
    `[began, upto)`."""

    upto: int
    began: int
    windows: dict[int, int] = field(default_factory=dict)
    pruned: int = 0
    unreadable: int = 0
    skipped: list[tuple[int, int]] = field(default_factory=list)
    kept_from: int = 0  # windows starting before it were pruned (or never kept)

    def encode(self) -> bytes:
        return json.dumps({"upto": self.upto, "began": self.began, "pruned": self.pruned,
                           "unreadable": self.unreadable, "skipped": [list(r) for r in self.skipped],
                           "kept_from": self.kept_from,
                           "windows": {str(w): n for w, n in sorted(self.windows.items())}},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "PartitionCounts":
        """Raises ValueError naming what is wrong with a node that is not ours."""
        try:
            node = json.loads(data)
            return cls(int(node["upto"]), int(node["began"]), {int(w): int(n) for w, n in node["windows"].items()},
                       int(node.get("pruned", 0)), int(node.get("unreadable", 0)),
                       [(int(a), int(b)) for a, b in node.get("skipped", [])], int(node.get("kept_from", 0)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a record-count node ({type(exc).__name__}: {exc}): {bytes(data[:200])!r}") from None

    def count(self, timestamps: Sequence[int], oldest_ms: int, window_ms: int = WINDOW_MS) -> None:
        """Add the records of `timestamps` to their windows; those of a window starting
        before `oldest_ms` (the retention horizon) go to `pruned`. A chunk's records
        mostly share one window: then two C-speed scans (min, max) place them all."""
        if not timestamps:
            return
        low, high = min(timestamps), max(timestamps)
        if low - low % window_ms == high - high % window_ms:
            self._add(low - low % window_ms, len(timestamps), oldest_ms)
            return
        for window, n in Counter(t - t % window_ms for t in timestamps).items():
            self._add(window, n, oldest_ms)

    def _add(self, window: int, n: int, oldest_ms: int) -> None:
        if window < oldest_ms:
            self.pruned += n
        else:
            self.windows[window] = self.windows.get(window, 0) + n

    def count_entries(self, data: bytes | memoryview, offset: int, oldest_ms: int,
                      window_ms: int = WINDOW_MS) -> None:
        """Count the records of the whole entries `data` holds, read at `offset` (==
        `upto`), and move `upto` past them. Read without checking CRCs
        (`record_timestamps`): committed bytes count as what they are, so a record damaged
        on disk since is counted, and the table that lacks it shows the loss as missing.
        An entry whose structure does not decode (no count of records to take from it)
        is passed over and counted in `unreadable`; past one whose size is impossible
        the chunk is not read."""
        assert offset == self.upto, (offset, self.upto)
        end = offset + len(data)
        view = memoryview(data)
        while self.upto < end:
            rest = view[self.upto - offset:]
            timestamps, stop = record_timestamps(rest)
            self.count(timestamps, oldest_ms, window_ms)
            if stop == len(rest):
                self.upto = end
                continue
            self.unreadable += 1
            size = first_entry_size(rest[stop:])
            self.upto = self.upto + stop + size if size and size >= HEADER_SIZE and stop + size <= len(rest) else end

    def prune(self, oldest_ms: int) -> None:
        """Drop the windows that start before `oldest_ms`, adding them to `pruned`."""
        self.kept_from = max(self.kept_from, oldest_ms)
        for window in [w for w in self.windows if w < oldest_ms]:
            self.pruned += self.windows.pop(window)
