"""The Parquet-directory target: one directory per batch, published by one rename.

::

    <warehouse>/<table>/_staging/<batch_id>.<attempt>/     written by one load attempt
        event_date=.../event_hour=.../part-*.parquet
        _rejects/part-*.parquet                             values that did not parse
        _logbus_counts.json                                 rows per (topic, 10-minute window)
    <warehouse>/<table>/batch_id=<batch_id>/                the same directory, after one rename
        _logbus_batch.json                                  ranges, counts, run id, row count, its files
    <warehouse>/<table>/_logbus_commit.lock                 serializes check-and-rename
    <warehouse>/<table>/_logbus_complete_through.json       the audit's complete-through watermark
    <warehouse>/<table>/_logbus_ends.json                   a cache of committed ends (by batch ids)
    <warehouse>/_audit/<table>/                             audit reports

`rename(2)` is atomic on a local or POSIX-mounted filesystem (and on HDFS), so a reader —
plain `spark.read.parquet("<warehouse>/<table>")` or the next offset snapshot — sees all
of a batch or none of it. The compare-and-swap of the commit holds a POSIX record lock
(`fcntl.lockf`) on the table's lock file while it re-lists the committed batches and
renames: the kernel (or the NFS lock manager) releases it when the holder dies, even by
SIGKILL, so a killed commit never blocks the table.

The audit's table tier (`contents`) counts what readers see: every file under the table
that no `_`/`.` directory or name hides, rows from its Parquet footer, the hour from its
`event_date=`/`event_hour=` directories (else from the footer's `timestamp` statistics).
A file belongs to a batch when it lies in the batch's directory and its record lists it.

Pure Python (pathlib, os, fcntl; pyarrow for the footers); usable without Airflow.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Iterator

from airflow_provider_logbus.plan import BatchPlan, Range
from airflow_provider_logbus.staged import StagedBatch, reject_files, write_json_atomic
from airflow_provider_logbus.targets.base import (BatchRecord, CommitTarget, TableContents, TableFile, TableState,
                                                  TargetError, committed_ends)

logger = logging.getLogger(__name__)

BATCH_RECORD = "_logbus_batch.json"
STAGING = "_staging"
AUDIT_DIR = "_audit"
LOCK_FILE = "_logbus_commit.lock"
COMPLETE_THROUGH = "_logbus_complete_through.json"
ENDS_CACHE = "_logbus_ends.json"
BATCH_PREFIX = "batch_id="
HOUR_MS = 3_600_000


def fsync_dir(path: Path) -> None:
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


class DirectoryTarget(CommitTarget):
    """A table under a local (or POSIX-mounted) warehouse directory."""

    layout = "directory"

    def __init__(self, warehouse: str | os.PathLike, table: str) -> None:
        if not str(warehouse):
            raise TargetError("the warehouse path is empty")
        if "://" in str(warehouse):
            raise TargetError(
                f"the directory target cannot use {str(warehouse)!r}: it publishes a batch by renaming a directory "
                "under a file lock, which an object store cannot do atomically; use target='iceberg' for tables on "
                "object storage, or a local or shared POSIX path here")
        if not table or "/" in table or table.startswith(("_", ".")):
            raise TargetError(f"invalid table name {table!r}: no '/', and not starting with '_' or '.'")
        super().__init__(table)
        self.root = Path(warehouse)
        self.table_dir = self.root / table

    def __repr__(self) -> str:
        return f"DirectoryTarget({str(self.root)!r}, {self.table!r})"

    def batch_dir(self, batch_id: str) -> Path:
        return self.table_dir / f"{BATCH_PREFIX}{batch_id}"

    def audit_dir(self) -> Path:
        return self.root / AUDIT_DIR / self.table

    # ----------------------------------------------------------------- reading

    def _batch_ids(self) -> list[str]:
        if not self.table_dir.is_dir():
            return []
        return sorted(child.name[len(BATCH_PREFIX):] for child in self.table_dir.iterdir()
                      if child.name.startswith(BATCH_PREFIX) and (child / BATCH_RECORD).exists())

    def dataset(self) -> tuple[str, str]:
        return "file", str(self.table_dir.resolve())

    def batch(self, batch_id: str) -> BatchRecord | None:
        path = self.batch_dir(batch_id) / BATCH_RECORD
        try:
            return BatchRecord.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            raise TargetError(f"unreadable batch record {path}: {exc}") from None

    def batches(self) -> list[BatchRecord]:
        records = [r for r in (self.batch(b) for b in self._batch_ids()) if r is not None]
        return sorted(records, key=lambda r: (r.interval_end, r.batch_id))

    def reject_files(self, batch_id: str) -> list[str]:
        return [str(p) for p in reject_files(self.batch_dir(batch_id))]

    def state(self) -> TableState:
        ids = self._batch_ids()
        return TableState(ends=self._ends(ids), batch_ids=frozenset(ids), token=frozenset(ids), exists=bool(ids))

    def _ends(self, ids: list[str]) -> dict[tuple[str, int], int]:
        """The committed ends of batches `ids`, reading only the records that the cache
        beside the table has not folded yet: after a year of hourly batches, reading
        every record took seconds at every snapshot and commit. Published records never
        change, so a cache keyed by the ids it folded stays right for them; it is
        rewritten best-effort, and a cache naming a batch that is gone (removed by hand)
        is ignored."""
        path = self.table_dir / ENDS_CACHE
        try:
            cached = json.loads(path.read_text())
            seen = set(cached["batch_ids"])
            ends = {(t, int(p)): int(e) for t, parts in cached["ends"].items() for p, e in parts.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            seen, ends = set(), {}
        if not seen <= set(ids):
            seen, ends = set(), {}
        new = [b for b in ids if b not in seen]
        if not new:
            return ends
        for key, end in committed_ends([r for r in (self.batch(b) for b in new) if r is not None]).items():
            ends[key] = max(end, ends.get(key, end))
        by_topic: dict[str, dict[str, int]] = {}
        for (topic, partition), end in sorted(ends.items()):
            by_topic.setdefault(topic, {})[str(partition)] = end
        try:
            write_json_atomic(path, {"batch_ids": sorted(ids), "ends": by_topic})
        except OSError as exc:
            logger.info("cannot update %s (%s); the next reader folds the records again", path, exc)
        return ends

    def contents(self, since_ms: int | None = None) -> TableContents:
        records = self.batches()
        known = {r.batch_id: r for r in records}
        files = []
        for path in sorted(p for p in self.table_dir.rglob("*") if p.is_file()):
            inside = PurePosixPath(path.relative_to(self.table_dir).as_posix())
            if any(part.startswith(("_", ".")) for part in inside.parts):
                continue  # hidden from readers: staging, rejects, records, locks
            hour = _hour_of(inside)
            if hour is not None and since_ms is not None and hour + HOUR_MS <= since_ms:
                continue
            batch_id = inside.parts[0][len(BATCH_PREFIX):] if inside.parts[0].startswith(BATCH_PREFIX) else None
            if batch_id is not None and batch_id not in known and (self.batch_dir(batch_id) / BATCH_RECORD).exists():
                continue  # a batch committed after the records were read: not in this view
            record = known.get(batch_id)
            if record is None or (record.files and str(inside.relative_to(inside.parts[0])) not in record.files):
                batch_id = None
            files += _footer_hours(path, hour, batch_id)
        return TableContents(records, files)

    # ----------------------------------------------------------------- writing

    def prepare_staging(self, batch_id: str, attempt: int | str) -> str:
        staging = self.table_dir / STAGING / f"{batch_id}.{attempt}"
        if staging.exists():
            shutil.rmtree(staging)
        staging.parent.mkdir(parents=True, exist_ok=True)
        return str(staging)

    def remove_attempts(self, batch_id: str, keep: str | None = None) -> None:
        staging_root = self.table_dir / STAGING
        if not staging_root.is_dir():
            return
        for child in staging_root.iterdir():
            if child.name.rsplit(".", 1)[0] == batch_id and str(child) != keep and child.is_dir():
                shutil.rmtree(child, ignore_errors=True)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.table_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.table_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _record(self, plan: BatchPlan, ranges: list[Range], staged: StagedBatch, run_id: str) -> BatchRecord:
        return replace(super()._record(plan, ranges, staged, run_id), files=staged.file_rows())

    def publish(self, state: TableState, record: BatchRecord, staged: StagedBatch) -> bool:
        staging = Path(staged.root)
        write_json_atomic(staging / BATCH_RECORD, record.to_dict(), tmp_dir=staging.parent)
        final = self.batch_dir(record.batch_id)
        with self._locked():
            if frozenset(self._batch_ids()) != state.token:
                return False
            try:
                os.rename(staging, final)  # the commit point: data and offsets together
            except OSError as exc:
                raise TargetError(f"cannot publish {staging} as {final}: {exc}") from None
        fsync_dir(final.parent)
        return True

    # ----------------------------------------------------------------- audit

    def write_audit(self, audit_id: str, report: dict) -> str:
        directory = self.audit_dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{audit_id}.json"
        write_json_atomic(path, report)
        return str(path)

    def announcement(self) -> dict | None:
        try:
            return json.loads((self.table_dir / COMPLETE_THROUGH).read_text())
        except FileNotFoundError:
            return None

    def announce(self, expected: dict | None, new: dict) -> bool:
        with self._locked():
            if self.announcement() != expected:
                return False
            write_json_atomic(self.table_dir / COMPLETE_THROUGH, new)
            return True


def _hour_of(inside: PurePosixPath) -> int | None:
    """The hour (ms) named by a path's `event_date=`/`event_hour=` directories, or None."""
    values = dict(part.split("=", 1) for part in inside.parts[:-1] if "=" in part)
    try:
        day = datetime.strptime(values["event_date"], "%Y-%m-%d").replace(tzinfo=timezone.utc)
        return int(day.timestamp() * 1000) + int(values["event_hour"]) * HOUR_MS
    except (KeyError, ValueError):
        return None


def _footer_hours(path: Path, hour: int | None, batch_id: str | None) -> list[TableFile]:
    """The file's rows per hour from its footer: all in `hour` when its directory names
    one, else per row group from the group's `timestamp` statistics (a file put anywhere
    by hand may span hours). A file whose row groups have no such statistics (Spark's
    INT96 timestamps have none) or span hours is the one case that reads data: its
    `timestamp` column alone."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
    except (OSError, ValueError) as exc:
        raise TargetError(f"{path} is in the table but is not a readable Parquet file ({exc}): readers of the "
                          "table fail on it too; move it out of the table") from None
    if hour is not None:
        return [TableFile(str(path), hour, meta.num_rows, batch_id)]
    if "timestamp" not in meta.schema.names:
        raise TargetError(f"{path} is in the table outside an hour directory and has no timestamp column: its "
                          "rows belong to no hour; move it out of the table")
    column = meta.schema.names.index("timestamp")
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    stats = [g.column(column).statistics for g in groups]
    if all(st is not None and st.has_min_max and _ms(st.min) // HOUR_MS == _ms(st.max) // HOUR_MS for st in stats):
        starts = [(_ms(st.min), g.num_rows) for st, g in zip(stats, groups)]
    else:
        starts = [(_ms(t), 1) for t in pq.read_table(path, columns=["timestamp"])["timestamp"].to_pylist()]
    per_hour: dict[int, int] = {}
    for ms, rows in starts:
        per_hour[ms - ms % HOUR_MS] = per_hour.get(ms - ms % HOUR_MS, 0) + rows
    return [TableFile(str(path), h, n, batch_id) for h, n in sorted(per_hour.items())]


def _ms(value: datetime) -> int:
    """Epoch ms of a Parquet timestamp as pyarrow gives it (naive ones are UTC)."""
    return int((value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp() * 1000)
