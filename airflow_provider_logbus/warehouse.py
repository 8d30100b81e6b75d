"""The batch commit protocol (DESIGN §7): a batch's data and its offsets are published
together by one directory rename.

::

    <warehouse>/<table>/_staging/<batch_id>.<attempt>/     written by the Spark load job
        event_date=.../event_hour=.../part-*.parquet
        _logbus_counts.json                                 rows per (topic, 10-minute window)
    <warehouse>/<table>/batch_id=<batch_id>/                the same directory, after one rename
        _logbus_batch.json                                  ranges, counts, run id, row count

`rename(2)` is atomic on a local (or POSIX-mounted) filesystem, so a reader — plain
`spark.read.parquet("<warehouse>/<table>")` or the next offset snapshot — sees all of a
batch or none of it. A batch is identified by its data interval; publishing it again is
a no-op that returns the recorded batch, and staging left by failed attempts is removed.

Pure Python (pathlib, os); usable without Airflow.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

logger = logging.getLogger(__name__)

BATCH_RECORD = "_logbus_batch.json"
COUNTS_FILE = "_logbus_counts.json"
STAGING = "_staging"
AUDIT_DIR = "_audit"
COUNT_WINDOW_MS = 600_000  # counts per 10-minute window of the message timestamp


class WarehouseError(RuntimeError):
    """A batch cannot be published or read; the message says which directory and why."""


def batch_id_for(start: datetime, end: datetime) -> str:
    """`20240101T000000_20240101T010000` from a data interval (UTC)."""

    def fmt(d: datetime) -> str:
        if d.tzinfo is not None:
            d = d.astimezone(timezone.utc)
        return d.strftime("%Y%m%dT%H%M%S")

    return f"{fmt(start)}_{fmt(end)}"


@dataclass
class Range:
    """Bytes [start, end) of one partition loaded by a batch. `lost_start`/`lost_end`
    name bytes that retention deleted before they could be loaded (on_data_loss="skip")."""

    topic: str
    partition: int
    start: int
    end: int
    lost_start: int | None = None
    lost_end: int | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "Range":
        return cls(str(d["topic"]), int(d["partition"]), int(d["start"]), int(d["end"]),
                   d.get("lost_start"), d.get("lost_end"))

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.lost_start is None:
            d.pop("lost_start")
            d.pop("lost_end")
        return d


@dataclass
class BatchRecord:
    """What `_logbus_batch.json` holds: the proof of what a batch loaded."""

    table: str
    batch_id: str
    interval_start: str
    interval_end: str
    run_id: str
    ranges: list[dict]
    counts: list[dict]  # {"topic", "window_start", "count"}
    row_count: int
    committed_at: str = ""
    attempt: str = ""
    window_ms: int = COUNT_WINDOW_MS
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> "BatchRecord":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_dict(self) -> dict:
        return asdict(self)

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {int(r["partition"]): int(r["end"]) for r in self.ranges if r["topic"] == topic}


def write_json_atomic(path: Path, obj) -> None:
    """Write a JSON file so that readers see the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Warehouse:
    """Tables under a local (or POSIX-mounted) root directory."""

    def __init__(self, root: str | os.PathLike) -> None:
        if not str(root):
            raise WarehouseError("the warehouse path is empty")
        self.root = Path(root)

    def table_dir(self, table: str) -> Path:
        if not table or "/" in table or table.startswith(("_", ".")):
            raise WarehouseError(f"invalid table name {table!r}: no '/', and not starting with '_' or '.'")
        return self.root / table

    def staging_dir(self, table: str, batch_id: str, attempt: int | str) -> Path:
        return self.table_dir(table) / STAGING / f"{batch_id}.{attempt}"

    def batch_dir(self, table: str, batch_id: str) -> Path:
        return self.table_dir(table) / f"batch_id={batch_id}"

    def audit_dir(self, table: str) -> Path:
        return self.root / AUDIT_DIR / table

    def prepare_staging(self, table: str, batch_id: str, attempt: int | str) -> Path:
        """A fresh, empty staging directory for one load attempt."""
        staging = self.staging_dir(table, batch_id, attempt)
        if staging.exists():
            shutil.rmtree(staging)
        staging.parent.mkdir(parents=True, exist_ok=True)
        return staging

    # ----------------------------------------------------------------- reading

    def batch(self, table: str, batch_id: str) -> BatchRecord | None:
        path = self.batch_dir(table, batch_id) / BATCH_RECORD
        try:
            return BatchRecord.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            raise WarehouseError(f"unreadable batch record {path}: {exc}") from None

    def batches(self, table: str) -> list[BatchRecord]:
        """Every committed batch of the table, oldest interval first."""
        table_dir = self.table_dir(table)
        if not table_dir.is_dir():
            return []
        records = []
        for child in table_dir.iterdir():
            if child.name.startswith("batch_id=") and (child / BATCH_RECORD).exists():
                record = self.batch(table, child.name[len("batch_id="):])
                if record is not None:
                    records.append(record)
        return sorted(records, key=lambda r: (r.interval_end, r.batch_id))

    def table_exists(self, table: str) -> bool:
        return bool(self.batches(table))

    def committed_end_offsets(self, table: str, topic: str) -> dict[int, int]:
        """Per partition, the end offset of the last committed batch that read it (the
        largest end: batches of one table are sequential and contiguous)."""
        ends: dict[int, int] = {}
        for record in self.batches(table):
            for p, end in record.end_offsets(topic).items():
                ends[p] = max(end, ends.get(p, end))
        return ends

    @staticmethod
    def read_counts(staging: Path) -> dict:
        path = Path(staging) / COUNTS_FILE
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise WarehouseError(
                f"staging {staging} has no {COUNTS_FILE}: the load job did not finish for this attempt"
            ) from None

    # ----------------------------------------------------------------- publishing

    def publish(self, table: str, batch_id: str, staging: str | os.PathLike, *, interval_start: str,
                interval_end: str, run_id: str, ranges: list[dict]) -> tuple[BatchRecord, bool]:
        """Publish `staging` as batch `batch_id` with one rename. Returns (record, published_now):
        when the batch is already published, nothing changes and its record comes back."""
        existing = self.batch(table, batch_id)
        if existing is not None:
            logger.info("batch %s of %s is already committed; nothing to do", batch_id, table)
            self.remove_staging(table, batch_id)
            return existing, False
        staging = Path(staging)
        if not staging.is_dir():
            raise WarehouseError(f"staging directory {staging} does not exist; run the load task again")
        counts = self.read_counts(staging)
        record = BatchRecord(
            table=table, batch_id=batch_id, interval_start=interval_start, interval_end=interval_end,
            run_id=run_id, ranges=[Range.from_dict(r).to_dict() for r in ranges],
            counts=counts["counts"], row_count=int(counts["row_count"]),
            committed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            attempt=staging.name, window_ms=int(counts.get("window_ms", COUNT_WINDOW_MS)),
        )
        write_json_atomic(staging / BATCH_RECORD, record.to_dict())
        final = self.batch_dir(table, batch_id)
        try:
            os.rename(staging, final)  # the commit point: data and offsets together
        except OSError as exc:
            existing = self.batch(table, batch_id)
            if existing is not None:  # another attempt won the race
                self.remove_staging(table, batch_id)
                return existing, False
            raise WarehouseError(f"cannot publish {staging} as {final}: {exc}") from None
        _fsync_dir(final.parent)
        self.remove_staging(table, batch_id)
        logger.info("committed batch %s of %s: %d rows", batch_id, table, record.row_count)
        return record, True

    def remove_staging(self, table: str, batch_id: str) -> list[Path]:
        """Delete every staging attempt of a batch (left by failed or superseded tries)."""
        staging_root = self.table_dir(table) / STAGING
        removed = []
        if staging_root.is_dir():
            for child in staging_root.iterdir():
                if child.name.rsplit(".", 1)[0] == batch_id:
                    shutil.rmtree(child, ignore_errors=True)
                    removed.append(child)
        return removed

    def write_audit(self, table: str, audit_id: str, report: dict) -> Path:
        directory = self.audit_dir(table)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{audit_id}.json"
        write_json_atomic(path, report)
        return path


def now_ms() -> int:
    return int(time.time() * 1000)
