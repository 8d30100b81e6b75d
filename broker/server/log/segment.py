"""One segment file: `<20-digit base offset>.kafka`, plus a small `.meta` sidecar and
its entry index's `.index` sidecar (index.py).

The `.meta` sidecar keeps the smallest and largest message timestamps of a sealed
segment, so retention and offsets-before-time need not scan old segments at start-up.
Both are advisory: when missing or unreadable the segment is scanned instead.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from broker.common.message import HEADER, MAGICS, MIN_ENTRY_SIZE
from broker.server.log.files import SHARED, FileCache, SegmentFile
from broker.server.log.index import EntryIndex, IndexSlot
from broker.server.log.recovery import SCAN_CHUNK, scan_file

log = logging.getLogger(__name__)

SUFFIX = ".kafka"
META_SUFFIX = ".meta"


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SUFFIX}"


@dataclass(frozen=True)
class FileRegion:
    """Bytes `[position, position+length)` of an open segment file, to be sent with
    sendfile. Holding a region keeps the file open even if retention deletes it."""

    file: "os.PathLike | object"
    position: int
    length: int

    def __len__(self) -> int:  # a message set's size, wherever it is (`protocol.Body`)
        return self.length

    def read(self) -> bytes:
        return os.pread(self.file.fileno(), self.length, self.position) if self.length else b""


EMPTY = FileRegion(None, 0, 0)


WRITE_BEHIND_LIMIT = 1 << 20


class Segment:
    """An append-only file. The owning `Log`'s lock guards `size`, `_written`, `_unwritten`,
    `_torn` and the timestamps; the file is opened with O_APPEND so readers' seeks never
    move the write position.

    Appends are atomic: `_written` (the bytes in the file) advances only after a whole
    set is written; a write that fails part-way is cut off again with ftruncate, so the
    file, `size` and every offset handed out stay as they were before the append. If
    even the cut fails (`_torn`), the next write retries it first, because with
    O_APPEND a stray tail would put new entries at the wrong offset.

    Appends may be buffered (`_unwritten`) and written later with one `write` for many
    small sets: one syscall per 222-byte request was a third of the broker's time at
    batch size 1. `size` counts buffered bytes too; readers never see them because
    reads stop at the flushed offset and a flush writes the buffer first.

    The file is opened on first use and may be dropped by the `FileCache` when many
    segments are open; `file` reopens it."""

    def __init__(self, path: Path, base_offset: int, size: int, files: FileCache = SHARED) -> None:
        self.path = path
        self.base_offset = base_offset
        self._written = size
        self.size = size  # `_written` plus the buffered bytes; a plain attribute for the append path
        self.min_timestamp = -1
        self.max_timestamp = -1
        self._unwritten = bytearray()
        self._torn = False
        self._files = files
        self._file: SegmentFile | None = None
        self._used = False
        self.slot = IndexSlot(path)

    @classmethod
    def create(cls, directory: Path, base_offset: int, files: FileCache = SHARED) -> "Segment":
        path = directory / segment_name(base_offset)
        path.touch(exist_ok=False)
        segment = cls(path, base_offset, 0, files)
        segment.slot.index = EntryIndex()
        return segment

    @classmethod
    def open(cls, path: Path, files: FileCache = SHARED) -> "Segment":
        """A segment found on disk: a stat and its sidecar, no descriptor."""
        segment = cls(path, int(path.name[: -len(SUFFIX)]), path.stat().st_size, files)
        segment._load_meta()
        return segment

    @property
    def file(self) -> SegmentFile:
        file = self._file
        if file is None:
            return self._files.open(self)
        self._used = True
        return file

    @property
    def index(self) -> EntryIndex:
        """The entry index (index.py), loaded or rebuilt on first use, not at start-up."""
        return self.slot.get(self)

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size

    @property
    def meta_path(self) -> Path:
        return self.path.with_suffix(META_SUFFIX)

    def append(self, data: bytes | memoryview, buffered: bool = False) -> None:
        """Append a whole set: written at once, or (buffered) kept until `write_unwritten`.
        An unbuffered set with nothing buffered before it is written straight from the
        request, without a copy. Raises OSError with the segment as it was before (an
        unbuffered set after buffered ones fails together with them)."""
        if not buffered and not self._unwritten:
            self._write(data)
            self.size = self._written
            return
        self._unwritten += data
        self.size += len(data)
        if not buffered or len(self._unwritten) >= WRITE_BEHIND_LIMIT:
            self.write_unwritten()

    def write_unwritten(self) -> None:
        """One write of everything buffered; on failure the buffer is dropped (acks=0
        data) and the file cut back to what was written before."""
        if self._unwritten:
            data, self._unwritten = self._unwritten, bytearray()
            try:
                self._write(data)
            finally:
                self.size = self._written
                self.slot.cut(self, self._written)  # the dropped sets were indexed

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        """Write all of `data` or, on an error, none of it."""
        file = self.file  # held while its descriptor is in use (see FileCache)
        fd = file.fileno()
        if self._torn:
            os.ftruncate(fd, self._written)
            self._torn = False
        with memoryview(data) as view:
            written = 0
            try:
                while written < len(view):  # short writes are continued
                    written += os.write(fd, view[written:])
            except OSError:
                self._cut_back(fd)
                raise
        self._written += written

    def _cut_back(self, fd: int) -> None:
        """Remove a partly written set (a torn entry) from the end of the file."""
        try:
            os.ftruncate(fd, self._written)
        except OSError as exc:
            self._torn = True
            log.error("%s: cannot cut a partial write back to %d bytes (%s); retrying before the next write",
                      self.path, self._written, exc)

    def is_boundary(self, position: int) -> bool:
        """Does a plausible entry header start at `position` (bytes the segment holds)?
        FETCH version 0's check, kept as it was: the header's fields a reader needs to
        walk on — size within the segment, known magic, key length within the entry —
        not a proof; readers' CRC checks catch the rest. Everything else asks the
        entry index (`index`), which knows."""
        file = self.file
        head = os.pread(file.fileno(), HEADER.size, position)
        if len(head) < HEADER.size:
            return False
        size, magic, _, _, _, key_length = HEADER.unpack(head)
        return (
            MIN_ENTRY_SIZE <= size <= self._written - position - 4
            and magic in MAGICS
            and -1 <= key_length <= size - MIN_ENTRY_SIZE
        )

    def truncate(self, position: int) -> None:
        """Cut the file to `position` bytes and fsync it (replica truncation). Buffered
        appends are written first so that the cut applies to the whole content."""
        self.write_unwritten()
        file = self.file
        os.ftruncate(file.fileno(), position)
        os.fsync(file.fileno())
        self._written = self.size = position
        self.slot.cut(self, position)

    def note_timestamps(self, smallest: int, largest: int) -> None:
        if smallest >= 0 and (self.min_timestamp < 0 or smallest < self.min_timestamp):
            self.min_timestamp = smallest
        if largest > self.max_timestamp:
            self.max_timestamp = largest

    def fsync(self) -> None:
        file = self.file
        os.fsync(file.fileno())

    def region(self, position: int, length: int) -> FileRegion:
        return FileRegion(self.file, position, length)

    def recover(self, max_entry_bytes: int) -> int:
        """Scan every entry (`recovery.scan_file`), truncate at the first partial or
        invalid one, refresh the timestamps and the entry index. Returns the number of
        bytes cut off."""
        scanned = scan_file(self.path, self.file.fileno(), self.size, max_entry_bytes)
        cut = self.size - scanned.valid_bytes
        if cut:
            os.truncate(self.path, scanned.valid_bytes)
            self._written = self.size = scanned.valid_bytes
        self.min_timestamp, self.max_timestamp = scanned.min_timestamp, scanned.max_timestamp
        self.slot.index = scanned.index
        return cut

    def write_meta(self) -> None:
        """The sidecars of a segment being sealed or closed: its timestamps and, if in
        use, its entry index (the next start loads it instead of rebuilding it)."""
        tmp = self.meta_path.with_suffix(".meta.tmp")
        tmp.write_text(json.dumps({"min_timestamp": self.min_timestamp, "max_timestamp": self.max_timestamp}))
        os.replace(tmp, self.meta_path)
        self.slot.save()

    def _load_meta(self) -> bool:
        try:
            meta = json.loads(self.meta_path.read_text())
            self.min_timestamp, self.max_timestamp = int(meta["min_timestamp"]), int(meta["max_timestamp"])
            return True
        except (OSError, ValueError, KeyError, TypeError):
            return False

    @property
    def has_meta(self) -> bool:
        return self.meta_path.exists()

    def delete(self) -> None:
        """Unlink the files; the descriptor closes when the last reader drops it."""
        self.path.unlink(missing_ok=True)
        self.meta_path.unlink(missing_ok=True)
        self.slot.delete()
        self._files.forget(self)

    def close(self) -> None:
        file = self._files.forget(self)
        if file is not None:
            file.close()

    def __repr__(self) -> str:
        return f"Segment({self.path.name}, size={self.size})"
