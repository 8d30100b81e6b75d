"""A segment's sparse entry index: which entry holds a byte position, and how many
records lie below it — what a fetch at a record's offset inside an entry and
RECORD_COUNT need (docs/architecture.md, "Offsets"; docs/storage.md, "Entry index").

Kafka's offset index is the model: a point every `INTERVAL` bytes of log, each the
start position of an entry and the records of the segment before it, plus the
segment's total. A lookup bisects the points and walks entry sizes from the nearest
one — at most about `INTERVAL` bytes, never the segment. Points are added at append
(at a set's start; inside a large set while its entries are counted from their
headers alone), so the hot path pays a comparison per set.

Readers take no lock: points are only appended (`before` first, then `positions`, so a
reader never finds a position without its count) and a cut makes a new index."""

from __future__ import annotations

import bisect
import io
import logging
import os
import struct
import sys
import threading
import zlib
from array import array
from pathlib import Path
from typing import Protocol

from broker.common.message import (
    BATCH_FIELDS, HEADER, HEADER_SIZE, MAGIC_BATCH, MIN_ENTRY_SIZE, SIZE_FIELD, first_entry_size, whole_entries,
)
from broker.common.errors import InvalidMessage
from broker.common.records import entry_records

INTERVAL = 4096  # bytes of log between points, as Kafka's index.interval.bytes
WALK_CHUNK = 2 * INTERVAL
REBUILD_CHUNK = 1 << 20
_HEAD = struct.Struct(">ibb")  # size, magic, attributes
_COUNT = struct.Struct(">i")
_COUNT_AT = HEADER_SIZE + BATCH_FIELDS.size - 4  # a producer batch's count field (it has no key)


class EntryIndex:
    """Points (entry start, records before it) of a segment's first `size` bytes, and
    the `records` they hold."""

    __slots__ = ("positions", "before", "records", "size")

    def __init__(self, positions: array | None = None, before: array | None = None, records: int = 0,
                 size: int = 0) -> None:
        self.positions = positions if positions is not None else array("q")
        self.before = before if before is not None else array("q")
        self.records = records
        self.size = size

    def add_set(self, position: int, data: bytes | memoryview, records: int) -> None:
        """A set of `records` appended at `position` (an entry start). A set longer than
        the interval gets points inside it too, while its entries can be counted from
        their headers (a compressed plain set's count is inside: the walk stops)."""
        positions = self.positions
        if not positions or position - positions[-1] >= INTERVAL:
            self.before.append(self.records)
            positions.append(position)
        if len(data) > INTERVAL:
            self._inner_points(position, data)
        self.records += records
        self.size = position + len(data)

    def _inner_points(self, position: int, data: bytes | memoryview) -> None:
        before, last, pos, end = self.records, self.positions[-1], 0, len(data)
        while end - pos >= HEADER_SIZE:
            size, magic, attributes = _HEAD.unpack_from(data, pos)
            if position + pos - last >= INTERVAL:
                self.before.append(before)
                self.positions.append(position + pos)
                last = position + pos
            if magic == MAGIC_BATCH:
                before += _COUNT.unpack_from(data, pos + _COUNT_AT)[0]
            elif attributes:
                return
            else:
                before += 1
            pos += SIZE_FIELD + size

    def point(self, position: int) -> tuple[int, int]:
        """The last point at or before `position`: (its position, records before it)."""
        i = bisect.bisect_right(self.positions, position) - 1
        return (self.positions[i], self.before[i]) if i >= 0 else (0, 0)

    def entry_at(self, fd: int, position: int) -> tuple[int, int, int]:
        """(start, end, records) of the entry holding byte `position` (< `size`)."""
        start, before = self.point(position)
        start, end, _, chunk, rel = walk_to(fd, start, self.size, position, before, counting=False)
        return start, end, entry_count(fd, chunk, rel, start, end)

    def records_below(self, fd: int, position: int) -> int:
        """The records whose offsets (relative to the segment) are below `position`."""
        if position >= self.size:
            return self.records
        start, before = self.point(position)
        if start == position:
            return before
        start, end, before, chunk, rel = walk_to(fd, start, self.size, position, before, counting=True)
        return before + (min(entry_count(fd, chunk, rel, start, end), position - start) if start < position else 0)

    def cut(self, fd: int, position: int) -> "EntryIndex":
        """The index of the first `position` bytes (an entry boundary): a new one, so
        readers holding this one are not disturbed."""
        i = bisect.bisect_left(self.positions, position)
        if not i:
            return rebuild(fd, position)
        records = walk_to(fd, self.positions[i - 1], position, position, self.before[i - 1], counting=True)[2]
        return EntryIndex(self.positions[:i], self.before[:i], records, position)


def walk_to(fd: int, start: int, stop: int, position: int, before: int,
            counting: bool) -> tuple[int, int, int, bytes, int]:
    """Walk entry sizes from the entry start `start` to the entry holding `position`
    (or to `stop`): (its start, its end, `before` plus the records of the entries
    walked over when `counting`, and the chunk and offset where its header was read)."""
    chunk_at, chunk, pos = start, b"", start
    unpack, header_size, wanted = _HEAD.unpack_from, HEADER_SIZE, _COUNT_AT + 4
    while pos < stop:
        rel = pos - chunk_at
        if len(chunk) - rel < wanted:
            chunk_at, rel, chunk = pos, 0, os.pread(fd, min(WALK_CHUNK, stop - pos), pos)
            if len(chunk) < header_size:
                raise OSError(f"entry header cut short at byte {pos}")
        size, magic, attributes = unpack(chunk, rel)
        if size < MIN_ENTRY_SIZE:
            raise OSError(f"impossible entry size {size} at byte {pos}")
        end = pos + SIZE_FIELD + size
        if end > position:
            return pos, end, before, chunk, rel
        if counting:
            before += 1 if not attributes and magic != MAGIC_BATCH else entry_count(fd, chunk, rel, pos, end)
        pos = end
    return pos, pos, before, chunk, 0


def entry_count(fd: int, chunk: bytes, rel: int, start: int, end: int) -> int:
    """The records of the entry `[start, end)` whose header is at `chunk[rel:]`: read
    whole only when it is a compressed plain set (its count is inside)."""
    _, magic, attributes = _HEAD.unpack_from(chunk, rel)
    if magic == MAGIC_BATCH:
        if len(chunk) - rel < _COUNT_AT + 4:
            chunk, rel = os.pread(fd, _COUNT_AT + 4, start), 0
        return _COUNT.unpack_from(chunk, rel + _COUNT_AT)[0]
    if not attributes:
        return 1
    if rel + end - start > len(chunk):
        chunk, rel = os.pread(fd, end - start, start), 0
    return readable_records(chunk, rel)


def readable_records(buf: bytes | memoryview, pos: int) -> int:
    """`entry_records`, 0 for a well-framed compressed set that cannot be opened: readers
    skip it (docs/protocol.md), so no record of it is ever delivered or counted."""
    try:
        return entry_records(buf, pos)
    except InvalidMessage:
        return 0


def rebuild(fd: int, size: int) -> EntryIndex:
    """The index of a segment's first `size` bytes (whole entries), walked from its start."""
    index = EntryIndex()
    position = 0
    while position < size:
        data = os.pread(fd, min(REBUILD_CHUNK, size - position), position)
        whole = whole_entries(data)
        if not whole:
            if len(data) < size - position:  # one entry larger than a chunk
                data = os.pread(fd, first_entry_size(data) or len(data), position)
                whole = whole_entries(data)
            if not whole:
                raise OSError(f"no whole entry at byte {position} of {size}")
        feed(index, position, memoryview(data)[:whole])
        position += whole
    return index


def feed(index: EntryIndex, position: int, data: bytes | memoryview) -> None:
    """Add the whole, valid entries `data` found at `position` (recovery's scan), each
    counted (compressed sets opened)."""
    pos, end = 0, len(data)
    while pos < end:
        size = HEADER.unpack_from(data, pos)[0]
        start = position + pos
        if not index.positions or start - index.positions[-1] >= INTERVAL:
            index.before.append(index.records)
            index.positions.append(start)
        index.records += readable_records(data, pos)
        pos += SIZE_FIELD + size
    index.size = position + end


class IndexSlot:
    """A segment's index: none until first use, then loaded from its sidecar or — when
    that is missing, stale or corrupt — rebuilt from the file (and the sidecar written).
    `index` is replaced, never changed in place, on a cut."""

    __slots__ = ("path", "index")

    def __init__(self, segment_path: Path) -> None:
        self.path = segment_path
        self.index: EntryIndex | None = None

    def get(self, segment: "SegmentLike") -> EntryIndex:
        index = self.index
        if index is None:
            with _LOADING:
                index = self.index
                if index is None:
                    index = load(self.path)
                    if index is None:
                        index = rebuild(segment.file.fileno(), segment.size)
                        self._save(index)
                    self.index = index
        return index

    def cut(self, segment: "SegmentLike", position: int) -> None:
        """Forget what lies past `position` (an entry boundary): a truncation, or
        buffered sets dropped by a failed write."""
        index = self.index
        if index is None or index.size > position:
            sidecar_path(self.path).unlink(missing_ok=True)
            if index is not None:  # else rebuilt from the cut file at first use
                self.index = index.cut(segment.file.fileno(), position)

    def save(self) -> None:
        """At a roll or a clean close: the next start loads it instead of rebuilding."""
        if self.index is not None:
            save(self.index, self.path)

    def _save(self, index: EntryIndex) -> None:
        try:
            save(index, self.path)
        except OSError as exc:  # costs only another rebuild later
            logger.warning("%s: cannot write the entry index sidecar: %s", self.path, exc)

    def delete(self) -> None:
        sidecar_path(self.path).unlink(missing_ok=True)


class SegmentLike(Protocol):
    path: Path
    size: int

    @property
    def file(self) -> io.FileIO: ...


_LOADING = threading.Lock()  # one first use builds a segment's index
logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------ the sidecar

SIDECAR_SUFFIX = ".index"
_SIDECAR_MAGIC = b"LBX1"
_SIDECAR_HEAD = struct.Struct(">4sqqqq")  # magic, segment size, segment mtime (ns), records, points


def save(index: EntryIndex, segment_path: os.PathLike) -> None:
    """Write the index beside its segment (tmp + rename), stamped with the segment's
    size and modification time: a later change of the segment makes it stale."""
    stat = os.stat(segment_path)
    if stat.st_size != index.size:
        return  # buffered bytes not written yet, or a cut under way: nothing true to save
    path = sidecar_path(segment_path)
    body = _SIDECAR_HEAD.pack(_SIDECAR_MAGIC, stat.st_size, stat.st_mtime_ns, index.records, len(index.positions))
    body += index.positions.tobytes() + index.before.tobytes() if _BIG_ENDIAN else _swapped(index)
    tmp = path.with_suffix(SIDECAR_SUFFIX + ".tmp")
    tmp.write_bytes(body + zlib.crc32(body).to_bytes(4, "big"))
    os.replace(tmp, path)


def load(segment_path: os.PathLike) -> EntryIndex | None:
    """The sidecar's index if it is whole and matches the segment as it is now; None
    when it is missing, stale or corrupt (the caller rebuilds)."""
    try:
        data = sidecar_path(segment_path).read_bytes()
        stat = os.stat(segment_path)
    except OSError:
        return None
    if len(data) < _SIDECAR_HEAD.size + 4 or zlib.crc32(data[:-4]) != int.from_bytes(data[-4:], "big"):
        return None
    magic, size, mtime_ns, records, points = _SIDECAR_HEAD.unpack_from(data)
    if magic != _SIDECAR_MAGIC or (size, mtime_ns) != (stat.st_size, stat.st_mtime_ns):
        return None
    if len(data) != _SIDECAR_HEAD.size + 16 * points + 4:
        return None
    positions, before = array("q"), array("q")
    positions.frombytes(data[_SIDECAR_HEAD.size : _SIDECAR_HEAD.size + 8 * points])
    before.frombytes(data[_SIDECAR_HEAD.size + 8 * points : -4])
    if not _BIG_ENDIAN:
        positions.byteswap()
        before.byteswap()
    return EntryIndex(positions, before, records, size)


def sidecar_path(segment_path: os.PathLike) -> Path:
    return Path(segment_path).with_suffix(SIDECAR_SUFFIX)


_BIG_ENDIAN = sys.byteorder == "big"


def _swapped(index: EntryIndex) -> bytes:
    """The points big-endian, as the sidecar keeps them."""
    positions, before = array("q", index.positions), array("q", index.before)
    positions.byteswap()
    before.byteswap()
    return positions.tobytes() + before.tobytes()
