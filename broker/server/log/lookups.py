"""Answers about a log's offsets from its segments, without a lock (the caller passes
one view of them): where the set holding a record's offset starts (FETCH version 1),
how many records lie between two offsets (RECORD_COUNT), offsets before a time
(OFFSETS) — docs/architecture.md, "Offsets". Offsets are positions, so an entry
boundary is its own answer; anything else is resolved exactly by the segments' entry
indexes (index.py), never by walking a segment."""

from __future__ import annotations

import bisect
from typing import Iterator

from broker.common.errors import OffsetOutOfRange, StorageError
from broker.common.message import whole_entries
from broker.common.protocol import EARLIEST, LATEST
from broker.server.log.segment import SCAN_CHUNK, Segment


def covering(segment: Segment, position: int) -> int:
    """Where the set answering a fetch at `position` of the segment starts: the
    position itself at an entry start; the start of the entry holding it while it is
    one of that entry's records' offsets; else (past the entry's last record: a Kafka
    reader's last offset + 1) the next entry."""
    index = segment.index
    if index.point(position)[0] == position:  # a point is an entry start: nothing to read
        return position
    start, end, records = index.entry_at(segment.file.fileno(), position)
    if start == position or position - start < records:
        return start
    return end


def set_start(view: tuple[tuple[Segment, ...], tuple[int, ...]], visible: int, offset: int, name: str) -> int:
    """Where FETCH version 1 at `offset` starts its set (`covering`), from a log's view
    (its segments and their base offsets); an offset outside the visible records is
    left to the read to answer."""
    segments, bases = view
    if not bases[0] <= offset < visible:
        return offset
    segment = segments[bisect.bisect_right(bases, offset) - 1]
    try:
        return segment.base_offset + covering(segment, offset - segment.base_offset)
    except FileNotFoundError:
        raise OffsetOutOfRange(f"offset {offset} of partition {name} was just deleted by retention") from None
    except OSError as exc:
        raise StorageError(f"cannot read partition {name} at offset {offset}: {exc}") from None


def is_entry_start(segment: Segment, position: int) -> bool:
    """Exactly: does an entry start at `position` of the segment's bytes?"""
    return not position or segment.index.entry_at(segment.file.fileno(), position)[0] == position


def records_below(segments: tuple[Segment, ...], offset: int) -> int:
    """Records of the log's `segments` with offsets below `offset`: the whole segments'
    totals, then the index of the one holding `offset`."""
    records = 0
    for segment in segments:
        if segment.base_offset >= offset:
            break
        if offset >= segment.end_offset:
            records += segment.index.records
        else:
            records += segment.index.records_below(segment.file.fileno(), offset - segment.base_offset)
    return records


def record_count(segments: tuple[Segment, ...], visible: int, start: int, end: int, name: str) -> tuple[int, int, int]:
    """RECORD_COUNT: (records, start, end) — the records whose offsets lie in [start,
    end) after clamping `start` up to the log's start (retention) and `end` (-1: the
    visible end) down to `visible`."""
    if start > segments[-1].end_offset:
        raise OffsetOutOfRange(f"offset {start} is past the end {segments[-1].end_offset} of partition {name}")
    start = max(start, segments[0].base_offset)
    end = max(start, visible if end < 0 else min(end, visible))
    try:
        return records_below(segments, end) - records_below(segments, start), start, end
    except FileNotFoundError:
        raise OffsetOutOfRange(f"offset {start} of partition {name} was just deleted by retention") from None
    except OSError as exc:
        raise StorageError(f"cannot count the records of partition {name} in [{start}, {end}): {exc}") from None


def offsets_before(segments: tuple[Segment, ...], visible: int, timestamp: int, max_offsets: int) -> list[int]:
    """Offsets from which to read everything produced after `timestamp`, newest first:
    the visible end if all data is older, then the start offsets of the segments whose
    data begins at or before `timestamp`. -1 is the end, -2 the start."""
    if timestamp == LATEST:
        return [visible][:max_offsets]
    if timestamp == EARLIEST:
        return [segments[0].base_offset][:max_offsets]
    held = [s for s in segments if s.base_offset < visible]
    offsets = []
    if held and held[-1].max_timestamp <= timestamp:
        offsets.append(visible)
    offsets += [s.base_offset for s in reversed(held) if 0 <= s.min_timestamp <= timestamp]
    return offsets[:max_offsets]


def chunks(segments: tuple[Segment, ...], start: int, end: int) -> Iterator[tuple[int, memoryview]]:
    """(offset, bytes) of the whole entries in [start, end), a chunk at a time."""
    for segment in segments:
        position = max(start, segment.base_offset) - segment.base_offset
        stop = min(end, segment.end_offset) - segment.base_offset
        chunk = SCAN_CHUNK
        while position < stop:
            data = segment.region(position, min(chunk, stop - position)).read()
            whole = whole_entries(data) if position + len(data) < stop else len(data)
            if not whole:
                chunk *= 2  # one entry larger than a chunk
                continue
            yield segment.base_offset + position, memoryview(data)[:whole]
            position += whole
