"""Open segment files, bounded: a broker with thousands of partitions must always start
and must not die of EMFILE.

Only segments that were used recently keep a descriptor. `FileCache` holds at most
`capacity` open segments and, when a new one opens past the bound, drops the file of
the one least recently used (second chance: a segment used since the last sweep is
passed over once). Dropping is not closing: a `FileRegion` still being sent holds the
file object, which closes when its last holder lets go; the segment reopens its file
on next use. The hot path (an append to an open segment) pays one attribute check.
"""

from __future__ import annotations

import io
import os
import resource
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Protocol


class SegmentFile(io.FileIO):
    """A segment's file (O_APPEND, unbuffered), closed quietly when dropped by everyone."""

    def __del__(self) -> None:
        if not self.closed:
            self.close()


class Cached(Protocol):
    path: Path
    _file: SegmentFile | None
    _used: bool


def _existing(path: str, flags: int) -> int:
    """`open` flags of mode "a+" less O_CREAT: the file must already exist."""
    return os.open(path, flags & ~os.O_CREAT)


def default_capacity() -> int:
    """Half of the soft open-files limit (the other half is for sockets, ZooKeeper,
    regions being sent), at least 16."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 15
    return max(16, soft // 2)


class FileCache:
    """`_lock` guards `_open` (the segments holding a file, oldest first)."""

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity if capacity > 0 else default_capacity()
        self._open: OrderedDict[int, Cached] = OrderedDict()
        self._lock = threading.Lock()
        self.opened = 0  # files opened so far (a reopened segment counts again)

    def open(self, segment: Cached) -> SegmentFile:
        """The segment's file, opened now; may drop other segments' files. Never created
        here (`Segment.create` makes new files): a reader racing retention must find the
        file gone (FileNotFoundError: out of range), not an empty one made in its place."""
        file = SegmentFile(os.fspath(segment.path), "a+", opener=_existing)
        with self._lock:
            current = segment._file
            if current is not None:  # another thread opened it meanwhile
                del file
                return current
            self._evict(self.capacity - 1)  # before inserting: the file just opened is never the one dropped
            segment._file = file
            segment._used = False
            self._open[id(segment)] = segment
            self.opened += 1
        return file

    def _evict(self, limit: int) -> None:
        """Drop files until at most `limit` are held. Caller holds `_lock`. Callers of
        `Segment.file` keep the file object in a local while they use its descriptor, so
        a drop never closes a descriptor under a write or a read."""
        chances = len(self._open)
        while len(self._open) > limit:
            key, oldest = self._open.popitem(last=False)
            if oldest._used and chances > 0:
                chances -= 1
                oldest._used = False
                self._open[key] = oldest
                continue
            oldest._file = None

    def forget(self, segment: Cached) -> SegmentFile | None:
        """Stop tracking a segment (closed or deleted); returns the file it held."""
        with self._lock:
            self._open.pop(id(segment), None)
            file, segment._file = segment._file, None
        return file

    def __len__(self) -> int:
        return len(self._open)


SHARED = FileCache()  # for logs made without a manager (tests, tools)
