"""Producer state (docs/storage.md, "Producer state"): per partition, what each
idempotent producer id last appended, so a retried batch is answered with its first
append's offsets instead of being appended twice (Kafka's KIP-98).

For each producer id the state keeps its epoch, the first and last sequence and the
offsets of its last `BATCHES_KEPT` batches (as many as a producer may have in flight),
and the largest timestamp it wrote. The leader checks each batch (`check`) before the
append and records it after (`record`); followers and recovery learn from bytes that
are already in the log (`learn`), so every replica holds the same state and a new
leader dedupes retries of batches its predecessor appended.

The state is derived from the log, never the other way round: it is rebuilt from the
latest snapshot at or below the log's end plus a scan of the bytes after it, and
snapshots (`<offset>.producers` beside the segments, written at each roll and at clean
shutdown) only bound that scan. A snapshot past a truncation point is deleted with the
bytes it described.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from collections import deque
from pathlib import Path
from typing import NamedTuple

from broker.common.errors import DuplicateSequence, InvalidProducerEpoch, OutOfOrderSequence
from broker.common.message import HEADER, SEQUENCE_LIMIT, BatchIdentity, iter_batches

logger = logging.getLogger(__name__)

BATCHES_KEPT = 5  # Kafka's max.in.flight.requests.per.connection for idempotence
SNAPSHOT_SUFFIX = ".producers"
SNAPSHOTS_KEPT = 3


class AppendedBatch(NamedTuple):
    """A batch the partition holds: its sequences and where it is."""

    first_sequence: int
    last_sequence: int
    base_offset: int
    next_offset: int


class ProducerEntry:
    __slots__ = ("epoch", "batches", "last_timestamp")

    def __init__(self, epoch: int, last_timestamp: int = -1) -> None:
        self.epoch = epoch
        self.batches: deque[AppendedBatch] = deque(maxlen=BATCHES_KEPT)
        self.last_timestamp = last_timestamp


class ProducerState:
    """The producer ids of one partition. Not thread-safe: the owning `Log` calls it
    under its lock."""

    def __init__(self, expiration_ms: int) -> None:
        self.expiration_ms = expiration_ms
        self.entries: dict[int, ProducerEntry] = {}

    def check(self, batch: BatchIdentity) -> AppendedBatch | None:
        """The batch already appended that `batch` repeats (answer with its offsets,
        append nothing), or None to append it. Raises InvalidProducerEpoch for an older
        epoch; DuplicateSequence for a batch that ends at or before the newest one but
        is older than those kept with their offsets (appended, offsets forgotten — a
        mirror resending from its checkpoint meets this); OutOfOrderSequence for any
        other sequence that does not follow the newest batch. An unknown producer id
        (new, or expired) may start at any sequence."""
        entry = self.entries.get(batch.producer_id)
        if entry is None:
            return None
        if batch.epoch < entry.epoch:
            raise InvalidProducerEpoch(
                f"producer {batch.producer_id} epoch {batch.epoch} is fenced: the partition holds epoch {entry.epoch}")
        if batch.epoch > entry.epoch:
            if batch.base_sequence != 0:
                raise OutOfOrderSequence(f"producer {batch.producer_id}'s new epoch {batch.epoch} must start at "
                                         f"sequence 0, not {batch.base_sequence}")
            return None
        last = batch.last_sequence
        for appended in entry.batches:
            if appended.first_sequence == batch.base_sequence and appended.last_sequence == last:
                return appended
        if not entry.batches:
            return None
        newest = entry.batches[-1].last_sequence
        if (newest - last) % SEQUENCE_LIMIT < SEQUENCE_LIMIT // 2:  # ends at or before the newest: appended
            raise DuplicateSequence(f"producer {batch.producer_id} epoch {batch.epoch}: sequences "
                                    f"{batch.base_sequence}..{last} were appended before its last "
                                    f"{BATCHES_KEPT} batches")
        expected = (newest + 1) % SEQUENCE_LIMIT
        if batch.base_sequence != expected:
            raise OutOfOrderSequence(f"producer {batch.producer_id} epoch {batch.epoch}: expected sequence "
                                     f"{expected}, got {batch.base_sequence}")
        return None

    def record(self, batch: BatchIdentity, base_offset: int, next_offset: int, timestamp: int) -> None:
        """`batch` is now in the log at [base_offset, next_offset)."""
        entry = self.entries.get(batch.producer_id)
        if entry is None or batch.epoch != entry.epoch:
            entry = self.entries[batch.producer_id] = ProducerEntry(batch.epoch)
        entry.batches.append(AppendedBatch(batch.base_sequence, batch.last_sequence, base_offset, next_offset))
        entry.last_timestamp = max(entry.last_timestamp, timestamp)

    def learn(self, data: bytes | memoryview, base_offset: int) -> None:
        """Record every producer batch among the whole entries of `data`, which the log
        holds from `base_offset` (a follower's append, recovery's scan)."""
        for pos, end, identity in iter_batches(data):
            timestamp = HEADER.unpack_from(data, pos)[4]
            self.record(identity, base_offset + pos, base_offset + end, timestamp)

    def expire(self, now_ms: int) -> list[int]:
        """Forget producer ids that wrote nothing for `expiration_ms` (by their largest
        message timestamp, so a rebuild expires the same ids); their next batch starts
        afresh, at any sequence."""
        if self.expiration_ms < 0:
            return []
        limit = now_ms - self.expiration_ms
        gone = [pid for pid, entry in self.entries.items() if entry.last_timestamp < limit]
        for pid in gone:
            del self.entries[pid]
        return gone

    # ----------------------------------------------------------------- snapshots

    def to_json(self) -> dict:
        return {str(pid): {"epoch": e.epoch, "last_timestamp": e.last_timestamp, "batches": [list(b) for b in e.batches]}
                for pid, e in self.entries.items()}

    def load_json(self, data: dict) -> None:
        self.entries = {}
        for pid, e in data.items():
            entry = self.entries[int(pid)] = ProducerEntry(int(e["epoch"]), int(e["last_timestamp"]))
            entry.batches.extend(AppendedBatch(*map(int, b)) for b in e["batches"])


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offsets(directory: Path) -> list[int]:
    """Offsets of the snapshots in `directory`, ascending."""
    offsets = []
    for path in directory.glob("*" + SNAPSHOT_SUFFIX):
        try:
            offsets.append(int(path.name[: -len(SNAPSHOT_SUFFIX)]))
        except ValueError:
            continue
    return sorted(offsets)


def write_snapshot(directory: Path, offset: int, state: ProducerState) -> None:
    """Write the state as of `offset` atomically (temporary file, fsync, rename), with
    a CRC so a torn or edited file is ignored rather than trusted; keep the newest
    `SNAPSHOTS_KEPT`."""
    body = json.dumps({"offset": offset, "producers": state.to_json()}, separators=(",", ":")).encode()
    path = snapshot_path(directory, offset)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(b"%08x\n" % zlib.crc32(body) + body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in snapshot_offsets(directory)[:-SNAPSHOTS_KEPT]:
        snapshot_path(directory, old).unlink(missing_ok=True)


def read_snapshot(directory: Path, at_most: int, state: ProducerState) -> int | None:
    """Load into `state` the newest readable snapshot at or below `at_most`; its
    offset, or None (no usable snapshot: scan from the log's start). Snapshots past
    `at_most` describe bytes the log no longer holds and are deleted."""
    for offset in reversed(snapshot_offsets(directory)):
        path = snapshot_path(directory, offset)
        if offset > at_most:
            path.unlink(missing_ok=True)
            continue
        try:
            raw = path.read_bytes()
            crc, body = raw[:8], raw[9:]
            if int(crc, 16) != zlib.crc32(body):
                raise ValueError("CRC mismatch")
            data = json.loads(body)
            state.load_json(data["producers"])
            return int(data["offset"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring unreadable producer snapshot %s: %s", path, exc)
    return None


def delete_snapshots_below(directory: Path, offset: int) -> None:
    """Retention removed the bytes before `offset`; a snapshot below it cannot be
    scanned on from, except the newest, which still describes what was deleted."""
    offsets = [o for o in snapshot_offsets(directory) if o < offset]
    for old in offsets[:-1]:
        snapshot_path(directory, old).unlink(missing_ok=True)
