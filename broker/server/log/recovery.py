"""Recovery after an unclean stop: which segments of a partition are scanned and cut
(`recover_segments`), and the scan of one segment file (also of a segment without its
sidecars): every entry from the start, checked, up to the first partial or invalid
one — which is where the file is cut — and on the way what the segment keeps beside
its bytes: the timestamps and the entry index (index.py), so a kill -9 costs one read
of the newest segment, not one per sidecar."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, NamedTuple

from broker.common.message import ScanStop, scan
from broker.server.log.index import EntryIndex

if TYPE_CHECKING:
    from broker.server.log.segment import Segment

log = logging.getLogger(__name__)

SCAN_CHUNK = 16 << 20


class Scanned(NamedTuple):
    valid_bytes: int  # the whole, valid entries at the file's start
    min_timestamp: int
    max_timestamp: int
    index: EntryIndex  # of those bytes


def scan_file(path: os.PathLike, fd: int, size: int, max_entry_bytes: int) -> Scanned:
    """Scan the first `size` bytes of a segment file in chunks; a size field above
    `max_entry_bytes` is garbage, not an entry to wait for."""
    position, chunk = 0, SCAN_CHUNK
    smallest, largest = -1, -1
    index = EntryIndex()
    while position < size:
        data = os.pread(fd, min(chunk, size - position), position)
        result = scan(data, max_entry_bytes)
        index.add_entries(position, memoryview(data)[: result.valid_bytes])
        position += result.valid_bytes
        if result.count:
            smallest = result.min_timestamp if smallest < 0 else min(smallest, result.min_timestamp)
            largest = max(largest, result.max_timestamp)
        if result.stop is ScanStop.END:
            continue
        chunk_end = position + len(data) - result.valid_bytes
        if result.partial_tail and chunk_end < size:  # the entry runs past this chunk
            if result.valid_bytes == 0:
                chunk *= 2  # bounded: scan rejects sizes above max_entry_bytes
            continue
        log.warning("%s: %s; truncating at byte %d of %d", path, result.error, position, size)
        break
    return Scanned(position, smallest, largest, index)


def recover_segments(segments: list["Segment"], max_entry_bytes: int, name: str) -> tuple[list["Segment"], int]:
    """A partition's segments after an unclean shutdown, and the bytes removed: the
    newest segment and any whose end does not meet the next one's start (or that has
    no sidecar) scanned and cut at the first bad or partial entry; the segments that
    would follow a hole deleted."""
    removed = 0
    for i, segment in enumerate(segments):
        is_last = i == len(segments) - 1
        if not is_last and segment.end_offset == segments[i + 1].base_offset and segment.has_meta:
            continue
        removed += segment.recover(max_entry_bytes)
        segment.write_meta()
        if not is_last and segment.end_offset != segments[i + 1].base_offset:
            for later in segments[i + 1 :]:
                removed += later.size
                later.delete()
                later.close()
            log.warning("%s: dropped %d segment(s) after a torn segment", name, len(segments) - i - 1)
            segments = segments[: i + 1]
            break
    if removed:
        log.warning("%s: recovery removed %d bytes; log now ends at %d", name, removed, segments[-1].end_offset)
    return segments, removed
