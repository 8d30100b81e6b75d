"""Keeping a logbus Iceberg table healthy for a year of hourly loads (docs/provider.md,
"Table maintenance"): compaction of closed hours (`iceberg_compaction`), snapshot expiry
that keeps every batch record (the ledger, `iceberg_ledger`), and removal of the files
no snapshot references.

Every step is safe beside running loads and audits and against itself: compaction and
expiry are catalog commits that lose cleanly to a concurrent one, the ledger's append
skips what is there, and orphan removal deletes only files older than a safety margin
that no snapshot of the table or of its rejects and ledger tables references.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urlparse

from airflow_provider_logbus.targets.iceberg_batches import (
    COMPACTION, SNAPSHOTS_EXPIRED, batch_snapshots, compaction_snapshots, summary,
)
from airflow_provider_logbus.targets.iceberg_compaction import TARGET_FILE_BYTES, HourCompaction, compact_hours
from airflow_provider_logbus.targets.iceberg_ledger import COMPACTION as LEDGER_COMPACTION
from airflow_provider_logbus.targets.iceberg_ledger import LedgerEntry

logger = logging.getLogger(__name__)

EXPIRE_ATTEMPTS = 10
METADATA_FILES = (".avro", ".metadata.json")
DAY_MS = 86_400_000


@dataclass
class MaintenanceReport:
    """What one maintenance run did, for the task's log and XCom."""

    table: str
    compacted: list[HourCompaction] = field(default_factory=list)
    ledger_synced: int = 0
    snapshots_expired: int = 0
    orphans_removed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"table": self.table, "compacted": [h.to_dict() for h in self.compacted],
                "ledger_synced": self.ledger_synced, "snapshots_expired": self.snapshots_expired,
                "orphans_removed": len(self.orphans_removed)}


def sync_ledger(target) -> int:
    """Copy into the ledger every batch record and compaction account the current
    lineage's summaries hold and the ledger lacks (a commit killed after its catalog
    commit, before its ledger append); the number copied."""
    from airflow_provider_logbus.targets.iceberg import ledger_entry
    from airflow_provider_logbus.targets.iceberg_batches import record_of

    table = target.table_or_fail()
    target.ledger.ensure()
    entries = [ledger_entry(record_of(target.table, s)) for s in batch_snapshots(table)]
    for s in compaction_snapshots(table):
        account = json.loads(summary(s)[COMPACTION])
        entries.append(LedgerEntry(LEDGER_COMPACTION, f"{account['hour_ms']}.{s.snapshot_id}", s.snapshot_id, "",
                                   account))
    return target.ledger.append(entries)


def expire_snapshots(target, older_than_ms: int) -> int:
    """Expire the snapshots older than `older_than_ms` (never the current one) of the
    table and of its ledger, after the ledger holds every record they carry; the number
    of the table's snapshots expired. The rejects table keeps its snapshots: a batch's
    rejects are found by the snapshot that added them."""
    sync_ledger(target)
    _mark_expiring(target)
    expired = _expire(target.tables.load(target.identifier), older_than_ms)
    _expire(target.tables.load(target.ledger.identifier), older_than_ms)
    return expired


def _mark_expiring(target) -> None:
    """Set `logbus.snapshots-expired` before the first expiry: readers look in the
    ledger from then on (`iceberg_batches.lineage_truncated`)."""
    from pyiceberg.exceptions import CommitFailedException

    for _ in range(EXPIRE_ATTEMPTS):
        table = target.table_or_fail()
        if table.properties.get(SNAPSHOTS_EXPIRED) == "true":
            return
        try:
            with table.transaction() as tx:
                tx.set_properties({SNAPSHOTS_EXPIRED: "true"})
            return
        except CommitFailedException:  # a load committed meanwhile
            continue
    raise RuntimeError(f"{target.identifier}: could not mark the table before expiring its snapshots")


def _expire(table, older_than_ms: int) -> int:
    from pyiceberg.exceptions import CommitFailedException

    for _ in range(EXPIRE_ATTEMPTS):
        if table is None or table.current_snapshot() is None:
            return 0
        current = table.current_snapshot().snapshot_id
        old = [s.snapshot_id for s in table.metadata.snapshots
               if s.timestamp_ms < older_than_ms and s.snapshot_id != current]
        if not old:
            return 0
        try:
            table.maintenance.expire_snapshots().by_ids(old).commit()
            return len(old)
        except (CommitFailedException, ValueError):  # a concurrent expiry or commit: read again
            table = table.refresh()
    return 0


def referenced_files(*tables) -> set[str]:
    """Every file any snapshot of `tables` references — data and delete files, manifests,
    manifest lists — and their metadata files, as `_key` normalises them."""
    keys: set[str] = set()
    for table in tables:
        if table is None:
            continue
        keys.add(_key(table.metadata_location))
        keys.update(_key(m.metadata_file) for m in table.metadata.metadata_log)
        keys.update(_key(s.statistics_path) for s in table.metadata.statistics)
        keys.update(_key(s.statistics_path) for s in table.metadata.partition_statistics)
        seen_manifests: set[str] = set()
        for snapshot in table.metadata.snapshots:
            keys.add(_key(snapshot.manifest_list))
            for manifest in snapshot.manifests(table.io):
                if manifest.manifest_path in seen_manifests:
                    continue
                seen_manifests.add(manifest.manifest_path)
                keys.add(_key(manifest.manifest_path))
                keys.update(_key(e.data_file.file_path)
                            for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    return keys


def remove_orphans(target, older_than_s: float) -> list[str]:
    """Delete the files of the table, its rejects and its ledger that no snapshot of
    theirs references and that were last written more than `older_than_s` ago: under
    `data/`, attempts that died and files a compaction replaced once their snapshots
    expired; under `metadata/`, the manifests and metadata files of refused or killed
    commits (only `*.avro` and `*.metadata.json`: what a commit writes). A load still
    writing its staging is younger than the margin; listing comes before reading the
    references, so a file committed meanwhile is seen as referenced. Empty directories
    left behind go too. Returns the deleted paths."""
    from pyarrow.fs import FileType

    tables = [target.tables.load(i) for i in (target.identifier, target.rejects_identifier, target.ledger.identifier)]
    listings = []
    for table in (t for t in tables if t is not None):
        fs, _ = target.storage.resolve(table.location())
        for part in ("data", "metadata"):
            listings.append((fs, part, target.storage.entries(f"{table.location().rstrip('/')}/{part}",
                                                              recursive=True)))
    references = referenced_files(*(t.refresh() if t is not None else None for t in tables))
    horizon = time.time() - older_than_s
    removed = []
    for fs, part, listing in listings:
        for info in listing:
            if info.type != FileType.File or info.mtime is None or info.mtime.timestamp() > horizon:
                continue
            if _key(info.path) in references or (part == "metadata" and not info.path.endswith(METADATA_FILES)):
                continue
            try:
                fs.delete_file(info.path)
                removed.append(info.path)
            except FileNotFoundError:  # a concurrent run deleted it first
                pass
        if fs.type_name == "local":  # object stores have no directories to leave behind
            for info in sorted((i for i in listing if i.type == FileType.Directory), key=lambda i: -len(i.path)):
                try:
                    os.rmdir(info.path)  # only if empty: a load writing into it keeps it
                except OSError:
                    pass
    if removed:
        logger.info("%s: removed %d orphan file(s) older than %.0f s", target.identifier, len(removed), older_than_s)
    return removed


def _key(location: str) -> str:
    """A file's location as the filesystem lists it: `file:///a/b` and `/a/b` alike,
    `s3://bucket/k` as `bucket/k`."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return parsed.path
    return f"{parsed.netloc}{parsed.path}"


def maintain(target, *, now_ms: int | None = None, closed_before_ms: int | None = None,
             target_file_bytes: int = TARGET_FILE_BYTES, expire_older_than_ms: int | None = None,
             orphans_older_than_s: float | None = None, compact_since_ms: int | None = None) -> MaintenanceReport:
    """One maintenance run: compact the hours before `closed_before_ms` (None: none),
    sync the ledger, expire snapshots older than `expire_older_than_ms` (None: none),
    remove orphans older than `orphans_older_than_s` (None: none)."""
    now_ms = now_ms if now_ms is not None else int(datetime.now(timezone.utc).timestamp() * 1000)
    report = MaintenanceReport(target.identifier)
    if closed_before_ms is not None:
        report.compacted = compact_hours(target, closed_before_ms, target_file_bytes, compact_since_ms)
    report.ledger_synced = sync_ledger(target)
    target.ledger.compact()
    if expire_older_than_ms is not None:
        report.snapshots_expired = expire_snapshots(target, expire_older_than_ms)
    if orphans_older_than_s is not None:
        report.orphans_removed = remove_orphans(target, orphans_older_than_s)
    return report
