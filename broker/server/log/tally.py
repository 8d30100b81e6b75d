"""A log's tally of its records per window of their timestamp, kept at append so that
the brokers' record counts (`broker.server.audit`) need not read what was appended
since this process started (docs/provider.md, "The broker tier").

Every append knows its set's records and the min and max of their timestamps (the
leader's validation, `check_batch`'s walk, a follower's scan of plain entries). A set
whose min and max fall in one window extends a *run* — (start, end, window, records):
consecutive appends in one window are one run, so a steady stream makes a handful of
runs per window whatever its rate. A set that spans windows, or whose records' times
the append did not learn (a follower's wrappers), ends the run and is a gap: the
counter reads it, as it reads everything appended before this process started.

Exactness: a run's bytes all hold records of its window, so any range of whole
entries inside it counts in that window; the records of a range that cuts a run are
the entry index's (`lookups.records_below`). Truncation drops the runs at and above
the cut; a run the cut splits is dropped whole (a gap: read).

Concurrency: appends (`note`, `truncate`) hold the log's lock and are the only
writers; runs are tuples, replaced, never changed, and the counter's thread reads a
copy of the list (one C-level copy under the GIL)."""

from __future__ import annotations

import bisect
from typing import NamedTuple

from broker.common.auditcounts import WINDOW_MS
from broker.server.log.lookups import records_below
from broker.server.log.segment import Segment

MAX_RUNS = 1024  # past it the oldest half is forgotten (read if still uncounted): a bound for logs nobody counts
Run = tuple[int, int, int, int]  # start, end, window, records: a plain tuple, built on the produce path


class Piece(NamedTuple):
    """Part of a counted range: its records all in `window`, or (window None) to be read."""

    start: int
    end: int
    window: int | None
    records: int


class Tally:
    """The runs of one log, oldest first; `counted` is where its counter has got to
    (runs ending there are dropped when the next run starts)."""

    __slots__ = ("runs", "counted", "window_ms")

    def __init__(self, window_ms: int = WINDOW_MS) -> None:
        self.runs: list[Run] = []
        self.counted = 0
        self.window_ms = window_ms

    def note(self, start: int, end: int, records: int, times: tuple[int, int] | None) -> None:
        """A set of `records` appended at [start, end) whose records' timestamps span
        `times` (None: not known). On the produce path: under a microsecond (BENCHMARKS.md)."""
        if times is None:
            return
        low, high = times
        window = low - low % self.window_ms
        if high >= window + self.window_ms:
            return  # spans windows: a gap
        runs = self.runs
        if runs:
            first, last_end, last_window, last_records = runs[-1]
            if last_end == start and last_window == window:
                runs[-1] = (first, end, window, last_records + records)
                return
            if len(runs) >= MAX_RUNS or runs[0][1] <= self.counted:
                self._forget()
        runs.append((start, end, window, records))

    def _forget(self) -> None:
        """Drop the runs the counter has passed, and the oldest half when there are too many."""
        runs = self.runs
        counted = bisect.bisect_right(runs, self.counted, key=_end)
        del runs[:max(counted, len(runs) // 2 if len(runs) >= MAX_RUNS else 0)]

    def truncate(self, offset: int) -> None:
        """The log was cut at `offset`: runs reaching past it go (caller holds the log's lock)."""
        runs = self.runs
        while runs and runs[-1][1] > offset:
            runs.pop()

    def pieces(self, segments: tuple[Segment, ...], start: int, end: int, window_ms: int) -> list[Piece]:
        """[start, end) — entry boundaries of the log whose `segments` are given, from its
        first segment's start to at most its visible end — as pieces in offset order:
        runs' (cut to the range) and the gaps between them. All one gap when the
        counter's windows are not the tally's."""
        runs = list(self.runs) if window_ms == self.window_ms else []
        first = bisect.bisect_right(runs, start, key=_end)
        out: list[Piece] = []
        for run in runs[first:]:
            run_start, run_end, window, _ = run
            if run_start >= end:
                break
            if run_start > start:
                out.append(Piece(start, run_start, None, -1))
                start = run_start
            stop = min(run_end, end)
            records = _records(segments, run, start, stop)
            out.append(Piece(start, stop, window if records >= 0 else None, records))
            start = stop
        if start < end:
            out.append(Piece(start, end, None, -1))
        return out


def _records(segments: tuple[Segment, ...], run: Run, start: int, end: int) -> int:
    """The records of [start, end), entry boundaries inside `run`; -1 when they cannot be
    known without reading. A whole run's are its own; a cut one's the entry index's, asked
    only strictly below the run's end, where the index is complete (its `records` may run
    ahead of its `size` while an append lands)."""
    run_start, run_end, _, records = run
    if start == run_start and end == run_end:
        return records
    if end < run_end:
        return records_below(segments, end) - records_below(segments, start)
    if run_start < segments[0].base_offset:  # retention took its head
        return -1
    return records - records_below(segments, start) + records_below(segments, run_start)


def _end(run: Run) -> int:
    return run[1]
