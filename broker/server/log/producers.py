"""Producer state (docs/storage.md, "Producer state"): per partition, what each
idempotent producer id last appended, so a retried batch is answered with its first
append's offsets instead of being appended twice (Kafka's KIP-98).

For each producer id the state keeps its epoch, the first and last sequence and the
offsets of its last `BATCHES_KEPT` batches (as many as a producer may have in flight),
and when this replica last appended one of its batches, by the broker's clock. The
leader checks each batch (`check`) before the append and records it after (`record`);
followers and recovery learn from bytes that are already in the log (`learn`), so every
replica holds the same batches and a new leader dedupes retries of batches its
predecessor appended.

The state is derived from the log, never the other way round: it is rebuilt from the
latest snapshot at or below the log's end plus a scan of the bytes after it, and
snapshots (`<offset>.producers` beside the segments, written at each roll and at clean
shutdown) only bound that scan. A snapshot past a truncation point is deleted with the
bytes it described.

Expiry (`expire`) forgets an id this replica appended nothing of for `expiration_ms`,
by the broker's clock — never by the messages' own timestamps, which a backfill, a
replay or a mirror sets days in the past (issue 33). Where the real append time is
unknown the state takes a later one, so an id is kept longer, never forgotten early: a
follower counts from its own append of the leader's bytes (after the leader's), a scan
from the time of the scan, and a snapshot written before append times were kept from
its load (or its largest message timestamp, if later: when the old rule let it go).
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from collections import deque
from pathlib import Path
from typing import Callable, NamedTuple

from broker.common.errors import DuplicateSequence, InvalidProducerEpoch, OutOfOrderSequence
from broker.common.message import SEQUENCE_LIMIT, BatchIdentity, iter_batches, now_ms

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
    """One producer id's epoch, its last batches, when this replica last appended one of
    them (ms, by the broker's clock), and `floor`: the first sequence of the epoch it
    holds. Batches from the floor on are in the log in order; one before it is not known
    to be (an unknown id may start anywhere, also after its earlier batches were refused)."""

    __slots__ = ("epoch", "batches", "appended_ms", "floor")

    def __init__(self, epoch: int, appended_ms: int, floor: int) -> None:
        self.epoch = epoch
        self.batches: deque[AppendedBatch] = deque(maxlen=BATCHES_KEPT)
        self.appended_ms = appended_ms
        self.floor = floor


class ProducerState:
    """The producer ids of one partition. Not thread-safe: the owning `Log` calls it
    under its lock. `clock` is the broker's (ms since the epoch), injected so tests
    can age the state without sleeping."""

    def __init__(self, expiration_ms: int, clock: Callable[[], int] = now_ms) -> None:
        self.expiration_ms = expiration_ms
        self.clock = clock
        self.entries: dict[int, ProducerEntry] = {}

    def check(self, batch: BatchIdentity) -> AppendedBatch | None:
        """The batch already appended that `batch` repeats (answer with its offsets,
        append nothing), or None to append it. Raises InvalidProducerEpoch for an older
        epoch; DuplicateSequence for a batch that ends at or before the newest one but
        is older than those kept with their offsets, and not before the entry's `floor`
        (appended, offsets forgotten — a mirror resending from its checkpoint meets
        this); OutOfOrderSequence for any other sequence that does not follow the newest
        batch, one before the floor included. An unknown producer id (new, or expired)
        may start at any sequence, as in Kafka (KIP-360)."""
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
        if (entry.floor - 1 - last) % SEQUENCE_LIMIT < SEQUENCE_LIMIT // 2:  # ends before the floor
            raise OutOfOrderSequence(f"producer {batch.producer_id} epoch {batch.epoch}: sequences "
                                     f"{batch.base_sequence}..{last} come before {entry.floor}, the first this "
                                     f"partition holds of it: not known to be appended (expected {newest + 1})")
        if (newest - last) % SEQUENCE_LIMIT < SEQUENCE_LIMIT // 2:  # ends at or before the newest: appended
            raise DuplicateSequence(f"producer {batch.producer_id} epoch {batch.epoch}: sequences "
                                    f"{batch.base_sequence}..{last} were appended before its last "
                                    f"{BATCHES_KEPT} batches")
        expected = (newest + 1) % SEQUENCE_LIMIT
        if batch.base_sequence != expected:
            raise OutOfOrderSequence(f"producer {batch.producer_id} epoch {batch.epoch}: expected sequence "
                                     f"{expected}, got {batch.base_sequence}")
        return None

    def record(self, batch: BatchIdentity, base_offset: int, next_offset: int) -> None:
        """`batch` is now in the log at [base_offset, next_offset): appended now."""
        appended_ms = self.clock()
        entry = self.entries.get(batch.producer_id)
        if entry is None or batch.epoch != entry.epoch:
            entry = self.entries[batch.producer_id] = ProducerEntry(batch.epoch, appended_ms, batch.base_sequence)
        entry.batches.append(AppendedBatch(batch.base_sequence, batch.last_sequence, base_offset, next_offset))
        entry.appended_ms = max(entry.appended_ms, appended_ms)

    def learn(self, data: bytes | memoryview, base_offset: int) -> None:
        """Record every producer batch among the whole entries of `data`, which the log
        holds from `base_offset`, as appended now: a follower's append of its leader's
        bytes (after the leader's own), or a scan of bytes appended before it."""
        for pos, end, identity in iter_batches(data):
            self.record(identity, base_offset + pos, base_offset + end)

    def expire(self) -> list[int]:
        """Forget producer ids this replica appended nothing of for longer than
        `expiration_ms`, by the broker's clock; their next batch starts afresh, at any
        sequence."""
        if self.expiration_ms < 0:
            return []
        limit = self.clock() - self.expiration_ms
        gone = [pid for pid, entry in self.entries.items() if entry.appended_ms < limit]
        for pid in gone:
            del self.entries[pid]
        return gone

    # ----------------------------------------------------------------- snapshots

    def to_json(self) -> dict:
        return {str(pid): {"epoch": e.epoch, "appended_ms": e.appended_ms, "floor": e.floor,
                           "batches": [list(b) for b in e.batches]} for pid, e in self.entries.items()}

    def load_json(self, data: dict) -> None:
        """The entries of a snapshot. One written before append times were kept holds
        the largest message timestamp instead: the id counts as appended now, or at
        that timestamp if later, so it outlives what the old rule gave it."""
        loaded_ms = self.clock()
        self.entries = {}
        for pid, e in data.items():
            appended_ms = int(e["appended_ms"]) if "appended_ms" in e else max(loaded_ms, int(e["last_timestamp"]))
            entry = self.entries[int(pid)] = ProducerEntry(int(e["epoch"]), appended_ms, int(e.get("floor", 0)))
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
