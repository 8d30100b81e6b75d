"""One partition: its segments, and the paper's verbs — append, flush, read, roll,
recover, delete old segments, offsets before a time; and the tally of what it appended.

Concurrency: appends and flushes may come from different threads (fsync runs in a
worker so it never blocks the event loop). `_lock` guards the active segment's writes,
`size` and timestamps, the unflushed counters, and replacing `_view`. Readers take no
lock: `_view` is an immutable (segments, base offsets) pair replaced on roll and
delete (copy-on-write), and `_flushed` is a single int.

Failures: an append either happens entirely or leaves the segment, its size and the
end offset as they were (see `Segment`); a write error becomes `StorageError` and, for
errors about the directory (full, read-only, I/O), takes the whole `LogDir` offline so
that later appends are refused without touching the disk until a probe finds it
writable again.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from broker.common.errors import InvalidMessage, InvalidRequest, OffsetOutOfRange, StorageError
from broker.common.kafka.records import ProducedBatch, decompressed_batch, kafka_entry
from broker.common.message import HEADER_SIZE, BatchIdentity, ScanStop, now_ms, scan
from broker.server.log.index import set_records
from broker.server.log.lookups import chunks, is_entry_start, offsets_before, record_count, set_start
from broker.server.log.epochs import LeaderEpochCache
from broker.server.log.files import SHARED, FileCache
from broker.server.log.logdir import LogDir
from broker.server.log.recovery import recover_segments
from broker.server.log.producers import (
    ProducerState, delete_snapshots_below, read_snapshot, snapshot_offsets, write_snapshot,
)
from broker.server.log.segment import EMPTY, SUFFIX, FileRegion, Segment
from broker.server.log.tally import Tally

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int = 1 << 30
    roll_ms: int = 7 * 24 * 3600 * 1000
    flush_interval_messages: int = 10_000
    flush_interval_ms: int = 200
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1: keep forever
    retention_bytes: int = -1  # -1: no size limit
    max_entry_bytes: int = 100 << 20  # recovery treats a larger size field as garbage
    producer_id_expiration_ms: int = 24 * 3600 * 1000  # idle producer ids forgotten after this; -1: never
    # broker-wide, read by the LogManager (they travel here because the manager is built from a LogConfig factory)
    open_files_max: int = 0  # segment files kept open at most; 0: half the open-files limit
    dir_probe_interval_ms: int = 1000  # how often an offline log directory is probed
    dir_min_free_bytes: int = 1 << 20  # free space a probe needs before the directory goes back online


class AppendResult(NamedTuple):  # one per append: made in C (`tuple.__new__`) on the produce path
    base_offset: int
    next_offset: int
    duplicate: bool = False  # a producer batch the log already held: nothing was appended


class Log:
    def __init__(
        self, directory: Path, topic: str, partition: int, config: LogConfig, recover: bool = False,
        files: FileCache = SHARED, log_dir: LogDir | None = None, clock: Callable[[], int] = now_ms,
    ) -> None:
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self.config = config
        self.log_dir = log_dir or LogDir(directory.parent, config.dir_probe_interval_ms, config.dir_min_free_bytes)
        self._files = files
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one fsync pass at a time per partition
        directory.mkdir(parents=True, exist_ok=True)
        segments = [Segment.open(p, files) for p in sorted(directory.glob("*" + SUFFIX))]
        if not segments:
            segments = [Segment.create(directory, 0, files)]
        if recover:  # after an unclean stop: the newest and any torn segment scanned and cut (recovery.py)
            segments = recover_segments(segments, config.max_entry_bytes, f"{topic}-{partition}")[0]
        self._set_segments(segments)
        self.tally = Tally()  # what this process appended, per window: the audit's counts read the rest (tally.py)
        for segment in self.segments:
            if segment.min_timestamp < 0 and segment.size and not segment.has_meta:
                segment.recover(config.max_entry_bytes)  # no sidecar: learn its timestamps
        self._flushed = self.end_offset  # what survived start-up is on disk
        # replicated partitions: the high watermark (min flushed end over the ISR), None
        # for an unreplicated one, whose consumers see up to its flushed end
        self.high_watermark: int | None = None
        self.visible_unflushed = False  # a replicated partition's leader under replica.visibility=followers-flushed
        self.epochs = LeaderEpochCache(directory)
        self.epochs.truncate_from(self.end_offset + 1)  # recovery may have cut the tail of a newer epoch
        self._clock = clock  # the producer state's (ms): an id's idleness is measured on it
        self._load_producers(self.end_offset)
        self._unflushed_messages = 0
        self._first_unflushed = 0.0
        self._rolled_at = time.monotonic()

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def _set_segments(self, segments: list[Segment]) -> None:
        self._view = (tuple(segments), tuple(s.base_offset for s in segments))

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._view[0]

    @property
    def start_offset(self) -> int:
        return self._view[0][0].base_offset

    @property
    def end_offset(self) -> int:
        """End of everything appended, flushed or not."""
        return self._view[0][-1].end_offset

    @property
    def flushed_offset(self) -> int:
        """End of what is on this broker's disk."""
        return self._flushed

    @property
    def visible_offset(self) -> int:
        """What consumers may read up to: the flushed end (the paper's rule) or, for a
        replicated partition, the high watermark — on every in-sync replica, flushed
        on the followers (docs/replication.md, "Visibility"); a leader may show it
        before its own flush (`visible_unflushed`)."""
        hw = self.high_watermark
        if hw is None:
            return self._flushed
        return min(hw, self.end_offset) if self.visible_unflushed else min(hw, self._flushed)

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    # ------------------------------------------------------------------ append and roll

    def append(
        self, message_set: bytes | memoryview, count: int, min_timestamp: int, max_timestamp: int,
        buffered: bool = False, batch: BatchIdentity | None = None, records: int = -1,
        times: tuple[int, int] | None = None,
    ) -> AppendResult:
        """Append an already validated set with one write; returns its offsets. With
        `buffered`, the write may wait for `write_unwritten` (or the next flush or roll),
        so one syscall covers many small sets.

        A set that is one producer `batch` is checked against the producer state first:
        a repeat of a batch the log holds is answered with that batch's offsets and
        not appended; an out-of-order or fenced one raises (producers.py). Raises
        StorageError, with nothing appended, when the write (or the roll before it)
        fails or the log directory is offline. `records`: the set's (counted here when
        not given), for the segment's entry index; `times`: the min and max of their
        timestamps, for the tally (None: unknown, so the audit's counts read the set)."""
        return self._append(len(message_set), message_set, None, count, min_timestamp, max_timestamp, buffered, batch,
                            set_records(message_set) if records < 0 else records, times)

    def append_kafka(self, batch: bytes | memoryview, produced: ProducedBatch, leader_epoch: int,
                     buffered: bool = False) -> AppendResult:
        """A batch `check_batch` passed (`produced`) as one magic-4 entry at the position P it
        lands at: baseOffset P (record i has offset P + i), epoch `leader_epoch`, uncompressed
        if `store_decompressed` (docs/kafka.md, "Record batches"). Otherwise as `append`."""
        records, max_ts = produced.records, produced.max_timestamp
        batch = decompressed_batch(batch) if produced.store_decompressed else batch
        return self._append(HEADER_SIZE + len(batch), None, lambda base: kafka_entry(batch, base, leader_epoch, max_ts),
                            records, max_ts, max_ts, buffered, produced.identity, records, produced.record_times)

    def _append(self, size: int, data: bytes | memoryview | None, entry_at: Callable[[int], bytes] | None, count: int,
                min_timestamp: int, max_timestamp: int, buffered: bool, batch: BatchIdentity | None,
                records: int, times: tuple[int, int] | None) -> AppendResult:
        """`append`'s body for `size` bytes: `data`, or what `entry_at(position)` builds where they land."""
        if not self.log_dir.online:
            self.log_dir.check_writable(self.name)
        with self._lock:
            if batch is not None:
                held = self.producers.check(batch)
                if held is not None:
                    return AppendResult(held.base_offset, held.next_offset, duplicate=True)
            try:
                active = self._view[0][-1]
                if active.size and (active.size + size > self.config.segment_bytes
                                    or (time.monotonic() - self._rolled_at) * 1000 >= self.config.roll_ms):
                    active = self._roll()
                base = active.end_offset
                index = active.index  # loaded before the append: it must not count this set yet
                data = data if entry_at is None else entry_at(base)
                active.append(data, buffered)
            except OSError as exc:
                raise self.log_dir.failed(exc, self.name, f"append of {size} bytes") from None
            end = active.end_offset
            index.add_set(base - active.base_offset, data, records)
            active.note_timestamps(min_timestamp, max_timestamp)
            self.tally.note(base, end, records, times)
            if batch is not None:
                self.producers.record(batch, base, end)
            if not self._unflushed_messages:
                self._first_unflushed = time.monotonic()
            self._unflushed_messages += count
            return tuple.__new__(AppendResult, (base, end, False))

    def append_replica(self, message_set: bytes | memoryview) -> AppendResult:
        """A follower's append of its leader's bytes: the whole entries at the front of
        `message_set` (a fetch may end in a partial one) are checked — sizes, CRCs — and
        appended unchanged, so the replica stays byte-identical to the leader."""
        result = scan(message_set, self.config.max_entry_bytes)
        if result.stop not in (ScanStop.END, ScanStop.PARTIAL):
            raise InvalidMessage(f"replicated set for {self.name} at offset {self.end_offset}: {result.error}")
        if not result.valid_bytes:
            return AppendResult(self.end_offset, self.end_offset)
        with memoryview(message_set) as view:
            whole = view[: result.valid_bytes]
            appended = self.append(whole, result.count, result.min_timestamp, result.max_timestamp,
                                   records=result.records, times=result.record_times)  # wrappers: -1, None
            if result.batches:  # the leader's producer state, learnt from its bytes
                with self._lock:
                    self.producers.learn(view[: result.valid_bytes], appended.base_offset)
            return appended

    def truncate_to(self, offset: int) -> int:
        """Drop everything at and after the message boundary `offset` (a follower whose
        log diverged from its leader's): later segments deleted, the one holding
        `offset` cut and fsync'd, the epoch cache cut too. Returns the bytes removed."""
        with self._lock:
            segments = list(self.segments)
            end = segments[-1].end_offset
            if offset >= end:
                return 0
            if offset < segments[0].base_offset:
                raise OffsetOutOfRange(f"cannot truncate {self.name} to {offset}: the log starts at "
                                       f"{segments[0].base_offset}")
            keep = [s for s in segments if s.base_offset <= offset]
            if len(keep) > 1 and keep[-1].base_offset == offset:
                keep.pop()  # `offset` is a segment's start: cut at the end of the one before
            active = keep[-1]
            position = offset - active.base_offset
            if 0 < position < active.size and not is_entry_start(active, position):
                raise InvalidRequest(f"cannot truncate {self.name} to {offset}: not a message boundary")
            try:
                active.truncate(position)
                for segment in segments[len(keep):]:
                    segment.delete()
                    segment.close()
            except OSError as exc:
                raise self.log_dir.failed(exc, self.name, f"truncation to {offset}") from None
            active.recover(self.config.max_entry_bytes)  # refresh its timestamps
            self._set_segments(keep)
            self._flushed = min(self._flushed, offset)
            if self.high_watermark is not None:
                self.high_watermark = min(self.high_watermark, offset)
            self._load_producers(offset)
            self.tally.truncate(offset)
        self.epochs.truncate_from(offset)
        logger.info("%s: truncated to offset %d (%d bytes removed)", self.name, offset, end - offset)
        return end - offset

    def _roll(self) -> Segment:
        """Start a new segment at the end offset, with a snapshot of the producer state
        there (recovery scans from it). Caller holds `_lock`."""
        old = self.segments[-1]
        old.write_unwritten()
        old.write_meta()
        self._snapshot_producers(old.end_offset)
        segment = Segment.create(self.directory, old.end_offset, self._files)
        self._set_segments([*self.segments, segment])
        self._rolled_at = time.monotonic()
        logger.info("%s: rolled to segment %s", self.name, segment.path.name)
        return segment

    # ------------------------------------------------------------------ producer state

    def _load_producers(self, end: int) -> None:
        """The producer state as of `end`: the newest snapshot at or below it, then the
        batches in the bytes after it (all of the log when there is no snapshot). Caller
        holds `_lock`, or is the constructor."""
        state = ProducerState(self.config.producer_id_expiration_ms, self._clock)
        snapshot = read_snapshot(self.directory, end, state)
        start = self.start_offset if snapshot is None else max(snapshot, self.start_offset)
        for base, data in chunks(self.segments, start, end):
            state.learn(data, base)  # appended at some time before now: now is the safe bound
        state.expire()
        self.producers = state

    def _snapshot_producers(self, offset: int) -> None:
        """Write the producer state as of `offset` (= the end offset). A failure costs
        only a longer scan at the next start: logged, never raised into an append."""
        self.producers.expire()
        try:
            write_snapshot(self.directory, offset, self.producers)
        except OSError as exc:
            logger.warning("%s: cannot write a producer snapshot at %d: %s", self.name, offset, exc)

    @property
    def producer_snapshots(self) -> list[int]:
        return snapshot_offsets(self.directory)

    # ------------------------------------------------------------------------- flush

    def write_unwritten(self) -> None:
        """Hand buffered appends to the OS (page cache). These are acks=0 appends: if the
        write fails they are dropped (the segment is cut back) and the failure is logged
        by the log directory, never raised into the connection that buffered them."""
        with self._lock:
            self._write_buffered()

    def _write_buffered(self) -> None:
        """`write_unwritten` of the active segment, a failure logged not raised. Caller
        holds `_lock`."""
        try:
            self.segments[-1].write_unwritten()
        except OSError as exc:
            self.log_dir.failed(exc, self.name, "write of buffered acks=0 appends")

    @property
    def unflushed_messages(self) -> int:
        return self._unflushed_messages

    def flush_due(self, now: float | None = None) -> bool:
        """True once M messages or S milliseconds of unflushed data have piled up."""
        if not self._unflushed_messages:
            return False
        if self._unflushed_messages >= self.config.flush_interval_messages:
            return True
        now = time.monotonic() if now is None else now
        return (now - self._first_unflushed) * 1000 >= self.config.flush_interval_ms

    def flush(self) -> int:
        """fsync every segment holding unflushed bytes; returns the new flushed offset.

        The fsync runs outside `_lock`, so appends continue meanwhile; what they add is
        covered by the next flush (group commit happens one level up).
        """
        with self._flush_lock:
            with self._lock:
                self._write_buffered()  # only acks=0 appends are buffered here: dropped on failure, and the fsync goes on
                target = self.end_offset
                dirty = [s for s in self.segments if s.end_offset > self._flushed]
                self._unflushed_messages = 0
            try:
                for segment in dirty:
                    self._fsync(segment)
            except OSError as exc:  # the flushed offset stays: nothing past it is acknowledged
                raise self.log_dir.failed(exc, self.name, "fsync") from None
            with self._lock:
                if target > self._flushed:
                    self._flushed = target
            return self._flushed

    def _fsync(self, segment: Segment) -> None:
        """A segment retention deleted after the flush listed it is gone, and its bytes
        need no durability: only a segment still in the log must be synced."""
        try:
            segment.fsync()
        except FileNotFoundError:
            if segment in self.segments:
                raise

    # -------------------------------------------------------------------------- read

    def read(self, offset: int, max_bytes: int, upto: int | None = None, exact: bool = False) -> FileRegion:
        """Bytes `[offset, min(offset+max_bytes, visible end of that segment))`; a
        follower's fetch reads `upto` the log end instead (what was written, flushed or
        not).

        The region may end inside a message; clients drop the partial tail. An offset
        outside `[start, end]` is OffsetOutOfRange; at (or past) the flushed end the
        region is empty. An offset where no entry header starts is InvalidRequest (a
        plausibility check, `Segment.is_boundary`) unless `exact`: the index found it.
        """
        segments, bases = self._view
        flushed = self.visible_offset if upto is None else upto
        if offset < bases[0] or offset > segments[-1].end_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside the range [{bases[0]}, {segments[-1].end_offset}] of partition {self.name}"
            )
        if offset >= flushed or max_bytes <= 0:
            return EMPTY
        segment = segments[bisect.bisect_right(bases, offset) - 1]
        end = min(segment.end_offset, flushed, offset + max_bytes)
        if end <= offset:
            return EMPTY
        position = offset - segment.base_offset
        try:
            if position and not exact and not segment.is_boundary(position):
                raise InvalidRequest(
                    f"offset {offset} of partition {self.name} is not a message boundary (no entry header starts "
                    f"there); fetch at an offset a message or OFFSETS gave"
                )
            return segment.region(position, end - offset)
        except FileNotFoundError:  # retention deleted the segment after this read took its snapshot
            raise OffsetOutOfRange(f"offset {offset} of partition {self.name} was just deleted by retention") from None
        except OSError as exc:  # e.g. EMFILE: a failure of this read, not of the log
            raise StorageError(f"cannot read partition {self.name} at offset {offset}: {exc.strerror or exc}") from None

    def read_covering(self, offset: int, max_bytes: int) -> tuple[int, FileRegion]:
        """FETCH version 1: the set holding the record at `offset` and where it starts
        (`lookups.set_start`: exact, from the segment's entry index)."""
        offset = set_start(self._view, self.visible_offset, offset, self.name)
        return offset, self.read(offset, max_bytes, exact=True)

    def record_count(self, start: int, end: int = -1) -> tuple[int, int, int]:
        """RECORD_COUNT: (records, start, end) of the records in [start, end), clamped
        to the log (`lookups.record_count`)."""
        return record_count(self.segments, self.visible_offset, start, end, self.name)

    def offsets_before(self, timestamp: int, max_offsets: int = 1) -> list[int]:
        """OFFSETS: the offsets to read from for what was produced after `timestamp`
        (`lookups.offsets_before`)."""
        return offsets_before(self.segments, self.visible_offset, timestamp, max_offsets)

    # ------------------------------------------------------------------ recovery, retention

    def delete_old_segments(self, now_ms: int) -> list[Segment]:
        """Retention: drop the oldest segments while they are older than `retention_ms`
        (by their largest message timestamp) or the partition is over `retention_bytes`.
        The active segment stays, so offsets keep growing."""
        with self._lock:
            segments = list(self.segments)
            total = sum(s.size for s in segments)
            removed: list[Segment] = []
            while len(segments) > 1:
                oldest = segments[0]
                too_old = self.config.retention_ms > 0 and now_ms - oldest.max_timestamp > self.config.retention_ms
                too_big = self.config.retention_bytes > 0 and total > self.config.retention_bytes
                if not (too_old or too_big):
                    break
                removed.append(segments.pop(0))
                total -= oldest.size
            if removed:
                self._set_segments(segments)
                delete_snapshots_below(self.directory, segments[0].base_offset)
            self.producers.expire()  # ids idle since their last append, on the producer state's clock
        for segment in removed:
            segment.delete()
            logger.info("%s: retention deleted %s", self.name, segment.path.name)
        return removed

    def close(self) -> bool:
        """Flush, record the active segment's timestamps, close the files. False when
        the flush or the sidecar could not be written (the next start must recover)."""
        clean = True
        try:
            self.flush()
        except StorageError as exc:
            logger.error("%s: final flush failed: %s", self.name, exc)
            clean = False
        with self._lock:
            try:
                self.segments[-1].write_meta()
            except OSError as exc:
                logger.error("%s: cannot write the segment sidecar at close: %s", self.name, exc)
                clean = False
            if clean:  # the next start reads it and scans nothing
                self._snapshot_producers(self.end_offset)
            for segment in self.segments:
                segment.close()
        return clean
