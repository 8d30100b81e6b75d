"""A batch record inside an Iceberg snapshot: the commit writes it into the snapshot's
summary (`summary_of`), and everything that asks which batches a table holds reads it
back from the snapshots of the current lineage (`batch_snapshots`, `record_of`). The
audit's table tier ties each data file to the batch of the snapshot that added it
(`table_files`).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from airflow_provider_logbus.plan import ranges_from_json, ranges_to_json
from airflow_provider_logbus.staged import StagedBatch, reject_files
from airflow_provider_logbus.storage import Storage
from airflow_provider_logbus.targets.base import BatchRecord, TableFile, TargetError

PREFIX = "logbus."
BATCH_ID = PREFIX + "batch-id"
SNAPSHOTS_EXPIRED = PREFIX + "snapshots-expired"  # table property: some batch records live only in the ledger
# a compaction snapshot's account of its files: {"hour_ms", "files": {path: {batch id: rows}}}
COMPACTION = PREFIX + "compaction"
HOUR_MS = 3_600_000


def summary(snapshot) -> dict[str, str]:
    return dict(snapshot.summary.additional_properties) if snapshot.summary else {}


def batch_snapshots(table) -> list:
    """Snapshots of the current lineage that carry a batch, oldest first."""
    if table is None or table.current_snapshot() is None:
        return []
    from pyiceberg.table.snapshots import ancestors_of

    chain = list(ancestors_of(table.current_snapshot(), table.metadata))
    return [s for s in reversed(chain) if BATCH_ID in summary(s)]


def lineage_truncated(table) -> bool:
    """Whether snapshots of the current lineage were expired, so that some batch records
    are only in the ledger: the maintenance marks the table before it expires anything
    (`SNAPSHOTS_EXPIRED`), and an expiry by other hands shows as a lineage whose oldest
    snapshot is not the table's first (its sequence number is over 1; expiry clears the
    parent id, so that cannot tell)."""
    if table is None or table.current_snapshot() is None:
        return False
    if table.properties.get(SNAPSHOTS_EXPIRED) == "true":
        return True
    from pyiceberg.table.snapshots import ancestors_of

    *_, oldest = ancestors_of(table.current_snapshot(), table.metadata)
    return oldest.parent_snapshot_id is not None or (oldest.sequence_number or 0) > 1


def compaction_snapshots(table) -> list:
    """Snapshots of the current lineage written by a compaction (`iceberg_compaction`)."""
    if table is None or table.current_snapshot() is None:
        return []
    from pyiceberg.table.snapshots import ancestors_of

    return [s for s in ancestors_of(table.current_snapshot(), table.metadata) if COMPACTION in summary(s)]


def record_of(table: str, snapshot) -> BatchRecord:
    """The batch record a commit wrote into `snapshot`'s summary."""
    s = summary(snapshot)
    planned = s.get(PREFIX + "planned-ranges")
    return BatchRecord(
        table=table, batch_id=s[PREFIX + "batch-id"], interval_start=s.get(PREFIX + "interval-start", ""),
        interval_end=s.get(PREFIX + "interval-end", ""), run_id=s.get(PREFIX + "run-id", ""),
        ranges=ranges_from_json(s.get(PREFIX + "ranges", "[]")), counts=json.loads(s.get(PREFIX + "counts", "[]")),
        row_count=int(s.get(PREFIX + "row-count", 0)), committed_at=s.get(PREFIX + "committed-at", ""),
        attempt=s.get(PREFIX + "attempt", ""), window_ms=int(s.get(PREFIX + "window-ms", 600_000)),
        rejected=json.loads(s.get(PREFIX + "rejected", "[]")),
        rejected_count=int(s.get(PREFIX + "rejected-count", 0)), schema=s.get(PREFIX + "schema"),
        schema_source=s.get(PREFIX + "schema-source"), planned_ranges=ranges_from_json(planned) if planned else None,
        extra={"snapshot_id": snapshot.snapshot_id, "staging": s.get(PREFIX + "staging", "")})


def snapshot_info(table, snapshot_id: int) -> dict | None:
    """Snapshot `snapshot_id` of `table` for people: id and parent (strings: Iceberg's
    64-bit ids lose digits as JavaScript numbers), time, operation and summary; None
    when the table has no such snapshot."""
    found = table.snapshot_by_id(snapshot_id) if table is not None else None
    if found is None:
        return None
    committed_at = datetime.fromtimestamp(found.timestamp_ms / 1000, timezone.utc).isoformat(timespec="seconds")
    return {"snapshot_id": str(found.snapshot_id),
            "parent_id": None if found.parent_snapshot_id is None else str(found.parent_snapshot_id),
            "committed_at": committed_at, "operation": found.summary.operation.value if found.summary else None,
            "summary": summary(found)}


def summary_of(record: BatchRecord, staged: StagedBatch) -> dict[str, str]:
    """The snapshot summary that carries `record` (the inverse of `record_of`)."""
    summary = {
        "batch-id": record.batch_id, "interval-start": record.interval_start,
        "interval-end": record.interval_end, "run-id": record.run_id, "ranges": ranges_to_json(record.ranges),
        "counts": json.dumps(record.counts), "row-count": str(record.row_count),
        "rejected": json.dumps(record.rejected), "rejected-count": str(record.rejected_count),
        "committed-at": record.committed_at, "attempt": record.attempt, "window-ms": str(record.window_ms),
        "staging": str(staged.root),
    }
    if record.schema:
        summary["schema"] = record.schema
    if record.schema_source:
        summary["schema-source"] = record.schema_source
    if record.planned_ranges is not None:
        summary["planned-ranges"] = ranges_to_json(record.planned_ranges)
    return {PREFIX + k: v for k, v in summary.items()}

def publish_rejects(load_rejects_table, record: BatchRecord, storage: Storage) -> None:
    """Add the batch's staged rejects to `<table>_rejects` in a snapshot carrying its
    batch id, unless one does already (a retry after the commit point finishes them)."""
    from pyiceberg.exceptions import CommitFailedException

    from airflow_provider_logbus.targets.iceberg_transaction import transaction

    staging = record.extra.get("staging")
    if not staging or not storage.is_dir(staging):
        return
    staged_rejects = reject_files(staging, storage)
    for _ in range(10):
        rejects_table = load_rejects_table()
        if rejects_table is None or not staged_rejects:
            return
        if any(summary(s).get(BATCH_ID) == record.batch_id for s in rejects_table.metadata.snapshots):
            return
        tx = transaction(rejects_table)
        tx.add_files(staged_rejects,
                     snapshot_properties={BATCH_ID: record.batch_id,
                                          PREFIX + "rejected-count": str(record.rejected_count)})
        try:
            tx.commit_transaction()
            return
        except CommitFailedException:
            continue


def files_added_by(table, batch_id: str) -> list[str]:
    """The data files the snapshot of batch `batch_id` added to `table` (of the current
    lineage; [] when no such snapshot)."""
    snapshot = next((s for s in batch_snapshots(table) if summary(s)[BATCH_ID] == batch_id), None)
    if snapshot is None:
        return []
    return [entry.data_file.file_path for manifest in snapshot.manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
            if entry.snapshot_id == snapshot.snapshot_id]


def table_files(table, identifier: str, batch_of: dict[int, str],
                compacted: dict[str, dict[str, int]] | None = None) -> list[TableFile]:
    """The current snapshot's data files (position deletes counted negative), each with
    its hour and the batch (`batch_of`: snapshot id -> batch id) that added it. A file a
    compaction wrote holds several batches' rows: it counts once per batch, with the rows
    the compaction accounted to each (`compacted`: path -> {batch id: rows}); rows its
    account does not cover (it cannot, unless the file was changed) count as outside."""
    from pyiceberg.manifest import DataFileContent

    current = table.current_snapshot() if table is not None else None
    files = []
    for manifest in current.manifests(table.io) if current is not None else ():
        hour_of = hour_reader(table, manifest.partition_spec_id)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data = entry.data_file
            if data.content == DataFileContent.EQUALITY_DELETES:
                raise TargetError(f"{identifier} has equality deletes ({data.file_path}): the audit cannot "
                                  "count the rows they remove without reading the data; compact the table")
            sign = -1 if data.content == DataFileContent.POSITION_DELETES else 1
            account = (compacted or {}).get(data.file_path) if sign == 1 else None
            if account is None:
                files.append(TableFile(data.file_path, hour_of(data), sign * data.record_count,
                                       batch_of.get(entry.snapshot_id), entry.snapshot_id))
                continue
            for batch_id, rows in sorted(account.items()):
                files.append(TableFile(data.file_path, hour_of(data), rows, batch_id, entry.snapshot_id))
            if data.record_count != sum(account.values()):
                files.append(TableFile(data.file_path, hour_of(data), data.record_count - sum(account.values()), None,
                                       entry.snapshot_id))
    return files


def hour_field(table, spec_id: int) -> tuple[int, object] | None:
    """(position, field) of spec `spec_id`'s `hour(timestamp)` partition field, or None."""
    from pyiceberg.transforms import HourTransform

    field_id = table.schema().find_field("timestamp").field_id
    return next(((i, f) for i, f in enumerate(table.specs()[spec_id].fields)
                 if f.source_id == field_id and isinstance(f.transform, HourTransform)), None)


def hour_reader(table, spec_id: int):
    """A data file's hour (ms): its `hour(timestamp)` partition value under spec
    `spec_id`, else (a file of an unpartitioned spec) its lower bound of `timestamp`."""
    from pyiceberg.conversions import from_bytes

    field_id = table.schema().find_field("timestamp").field_id
    found = hour_field(table, spec_id)
    position = found[0] if found is not None else None
    kind = table.schema().find_type(field_id)

    def hour_of(data) -> int:
        if position is not None and data.partition[position] is not None:
            return int(data.partition[position]) * HOUR_MS
        micros = from_bytes(kind, data.lower_bounds[field_id])
        return micros // 1000 - micros // 1000 % HOUR_MS

    return hour_of
