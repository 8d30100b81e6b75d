"""Recovery's scan of one segment file (after an unclean stop, or a segment without
its sidecars): every entry from the start, checked, up to the first partial or invalid
one — which is where the file is cut — and on the way what the segment keeps beside
its bytes: the timestamps and the entry index (index.py), so a kill -9 costs one read
of the newest segment, not one per sidecar."""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

from broker.common.message import ScanStop, scan
from broker.server.log.index import EntryIndex

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
