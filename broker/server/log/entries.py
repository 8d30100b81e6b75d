"""Which entry of a segment holds a byte position, and how many records it holds:
what a fetch at a record's offset inside an entry needs (docs/architecture.md,
"Offsets"). Offsets are positions, so an entry boundary needs no lookup; an offset
inside an entry is resolved here by walking entry sizes from the segment's start."""

from __future__ import annotations

import os

from broker.common.message import HEADER_SIZE, MIN_ENTRY_SIZE, SIZE_FIELD
from broker.common.records import entry_records
from broker.server.log.segment import Segment

WALK_CHUNK = 64 << 10


def entry_around(segment: Segment, position: int, written: int) -> tuple[int, int]:
    """(start, end) of the entry holding byte `position` of the segment's first
    `written` bytes, walked by size fields from the segment's first entry."""
    file = segment.file
    start = 0
    while start < written:
        chunk = os.pread(file.fileno(), min(WALK_CHUNK, written - start), start)
        pos = 0
        while len(chunk) - pos >= SIZE_FIELD:
            size = int.from_bytes(chunk[pos : pos + SIZE_FIELD], "big", signed=True)
            if size < MIN_ENTRY_SIZE:
                raise OSError(f"{segment.path}: impossible entry size {size} at byte {start + pos}")
            end = start + pos + SIZE_FIELD + size
            if end > position:
                return start + pos, end
            pos += SIZE_FIELD + size
        start += pos
    raise OSError(f"{segment.path}: no entry holds byte {position}")


def records_at(segment: Segment, start: int, end: int) -> int:
    """The records of the entry at `[start, end)`: its header tells, unless it is a
    compressed set (read whole and opened)."""
    file = segment.file
    head = os.pread(file.fileno(), HEADER_SIZE + 18, start)
    attributes = head[5]
    if attributes and head[4] != 3:  # a compressed magic-2 set: count inside
        head = os.pread(file.fileno(), end - start, start)
    return entry_records(head, 0)


def records_before(segment: Segment, position: int, written: int) -> int:
    """The records of the segment's first `written` bytes whose offsets are below
    `position` (relative to the segment's start): whole entries before it, and the
    records of the entry holding it whose offsets (start + i) are below it."""
    records, start = 0, 0
    while start < min(position, written):
        head = os.pread(segment.file.fileno(), SIZE_FIELD, start)
        end = start + SIZE_FIELD + int.from_bytes(head, "big", signed=True)
        held = records_at(segment, start, end)
        records += held if end <= position else min(held, position - start)
        start = end
    return records


def records_below(segments: tuple[Segment, ...], offset: int) -> int:
    """Records of the log's `segments` with offsets below `offset`."""
    records = 0
    for segment in segments:
        if segment.base_offset >= offset:
            break
        records += records_before(segment, offset - segment.base_offset, segment.end_offset - segment.base_offset)
    return records
