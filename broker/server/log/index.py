"""A segment's sparse entry index: which entry holds a byte position, and how many
records lie below it — what a fetch at a record's offset inside an entry and
RECORD_COUNT need (docs/architecture.md, "Offsets"; docs/storage.md, "Entry index").

Kafka's offset index is the model: a point every `INTERVAL` bytes of log, each the
start position of an entry and the records of the segment before it, plus the
segment's total. A lookup bisects the points and walks entry sizes from the nearest
one — at most about `INTERVAL` bytes plus one appended set (a set longer than
`LONG_SET` gets points every `INTERVAL` inside it too), never the segment. Points are
added at append, so the hot path pays a comparison per set.

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
    BATCH_FIELDS, HEADER_SIZE, KAFKA_FIELDS_AT, MAGIC_BATCH, MIN_ENTRY_SIZE, SIZE_FIELD, first_entry_size,
    whole_entries,
)
from broker.common.errors import InvalidMessage
from broker.common.records import count_records, entry_records

INTERVAL = 4096  # bytes of log between points, as Kafka's index.interval.bytes
LONG_SET = 8 * INTERVAL  # a set longer than this gets points inside it at append
WALK_CHUNK = 2 * INTERVAL
REBUILD_CHUNK = 1 << 20
_HEAD = struct.Struct(">ibb")  # size, magic, attributes
_COUNT = struct.Struct(">i")
_COUNT_AT = HEADER_SIZE + BATCH_FIELDS.size - 4  # a producer batch's count field (it has no key)
_COUNT_ATS = (0, 0, 0, _COUNT_AT, KAFKA_FIELDS_AT + BATCH_FIELDS.size - 4)  # by magic: 3's, 4's (recordsCount)


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
        """A set of `records` appended at `position` (an entry start). Like Kafka's
        index, points fall on appended sets' starts; only a set longer than `LONG_SET`
        gets points inside it (a walk of its headers: a fifth of the validation's cost
        for a set of 50 small entries, too much for every set), while its entries can be
        counted from their headers (a compressed plain set's count is inside: the walk
        stops there). Lookups inside a shorter set walk from its start."""
        positions = self.positions
        if not positions or position - positions[-1] >= INTERVAL:
            self.before.append(self.records)
            positions.append(position)
        if len(data) > LONG_SET:
            self._inner_points(position, data)
        self.records += records
        self.size = position + len(data)

    def _inner_points(self, position: int, data: bytes | memoryview) -> None:
        """Points inside a long appended set, while its entries' counts are in their
        headers (the records are added by `add_set`)."""
        records = self.records
        self.add_entries(position, data, opened=False)
        self.records = records

    def add_entries(self, position: int, data: bytes | memoryview, opened: bool = True) -> bool:
        """Points for the whole, valid entries `data` found at `position`, and their
        records: a producer batch's from its header, a compressed plain set's from
        inside (`opened`; else stop there and return False). One tight loop: recovery
        runs it over every entry of the newest segment."""
        positions, before, records = self.positions, self.before, self.records
        due = positions[-1] - position + INTERVAL if positions else 0  # where the next point is due, in `data`
        unpack, count_of, batch, pos, end = _HEAD.unpack_from, _COUNT.unpack_from, MAGIC_BATCH, 0, len(data)
        count_ats = _COUNT_ATS
        while pos < end:
            size, magic, attributes = unpack(data, pos)
            if pos >= due:
                before.append(records)
                positions.append(position + pos)
                due = pos + INTERVAL
            if magic >= batch:
                records += count_of(data, pos + count_ats[magic])[0]
            elif not attributes:
                records += 1
            elif opened:
                records += readable_records(data, pos)
            else:
                return False
            pos += SIZE_FIELD + size
        self.records = records
        self.size = position + end
        return True

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
    unpack, header_size, wanted = _HEAD.unpack_from, HEADER_SIZE, _COUNT_ATS[-1] + 4
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
            before += 1 if not attributes and magic < MAGIC_BATCH else entry_count(fd, chunk, rel, pos, end)
        pos = end
    return pos, pos, before, chunk, 0


def entry_count(fd: int, chunk: bytes, rel: int, start: int, end: int) -> int:
    """The records of the entry `[start, end)` whose header is at `chunk[rel:]`: read
    whole only when it is a compressed plain set (its count is inside)."""
    _, magic, attributes = _HEAD.unpack_from(chunk, rel)
    if magic >= MAGIC_BATCH:
        count_at = _COUNT_ATS[magic]
        if len(chunk) - rel < count_at + 4:
            chunk, rel = os.pread(fd, count_at + 4, start), 0
        return _COUNT.unpack_from(chunk, rel + count_at)[0]
    if not attributes:
        return 1
    if rel + end - start > len(chunk):
        chunk, rel = os.pread(fd, end - start, start), 0
    return readable_records(chunk, rel)


def set_records(buf: bytes | memoryview) -> int:
    """The records of a set of whole, valid entries (`readable_records` each)."""
    return count_records(buf, readable_records)


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
        index.add_entries(position, memoryview(data)[:whole])
        position += whole
    return index


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
