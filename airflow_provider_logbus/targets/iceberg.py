"""The Apache Iceberg target: a batch is one snapshot, and its offsets travel inside it.

A table `<namespace>.<table>` (namespace `logbus` unless the name has one) holds the
logbus columns (topic, partition, offset, timestamp, key, headers) and the declared value fields,
partitioned by `hour(timestamp)` (hidden partitioning: a query for one hour plans that
hour's files only). The Spark job writes one Parquet file per hour per task under the
table's location (`data/_logbus_staging/<batch_id>.<attempt>/`); the commit adds them in
one transaction whose snapshot summary holds

    logbus.batch-id, logbus.ranges (JSON), logbus.counts (JSON), logbus.rejected (JSON),
    logbus.run-id, logbus.interval-start/-end, logbus.planned-ranges (when re-planned)

and which sets the table property `logbus.committed-offsets` (JSON, topic → partition →
end), so the next snapshot reads one property instead of the whole history.

The compare-and-swap is the catalog's own: the transaction asserts that `main` still
points at the snapshot the commit read. pyiceberg retries a failed commit by rebasing it
onto the newer snapshot, which would let two attempts of one batch both land; tables
are created with `commit.retry.num-retries=0`, and a refused commit goes back to the
protocol's loop, which reads the table again (`CommitTarget.commit`).

The audit's table tier (`contents`) counts the rows the current snapshot holds per hour
from its manifests — each data file's `record_count` and `hour(timestamp)` partition
value, minus position deletes — and ties each file to the batch of the snapshot that
added it: a file added by a snapshot without `logbus.batch-id` came in outside the
commit protocol.

Rejected values go to `<table>_rejects` (topic, partition, offset, timestamp, key,
headers, value, error), one snapshot per batch with the same `logbus.batch-id`, after the main commit
and idempotently (a retry that finds the batch committed finishes its rejects). Then the
batch record goes into the ledger `<table>_batches` (`iceberg_ledger`), which keeps it
once the snapshot is expired; every reader of batch records takes summaries ∪ ledger.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from airflow_provider_logbus.staged import StagedBatch
from airflow_provider_logbus.storage import Storage, join, parent_of
from airflow_provider_logbus.targets.base import (BatchRecord, CommitTarget, TableContents, TableState, TargetError,
                                                  committed_ends)
from airflow_provider_logbus.targets.iceberg_batches import (
    BATCH_ID, batch_snapshots, files_added_by, publish_rejects, record_of, snapshot_info, summary, summary_of,
    table_files,
)
from airflow_provider_logbus.targets.iceberg_ledger import BATCH, Ledger, LedgerEntry
from airflow_provider_logbus.targets.iceberg_tables import IcebergTables, embedded_catalog, local_path

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "logbus"
STAGING = "_logbus_staging"
COMMITTED_OFFSETS = "logbus.committed-offsets"
COMPLETE_THROUGH = "logbus.complete-through"
ANNOUNCED = "logbus.announced"


class IcebergTarget(CommitTarget):
    """The commit protocol's target on an Iceberg table (module docstring): catalog and
    tables in `IcebergTables`, batch records in snapshot summaries in `iceberg_batches`."""

    layout = "iceberg"

    def __init__(self, table: str, *, catalog_properties: dict[str, Any] | None = None,
                 warehouse: str | None = None, catalog_name: str = "logbus") -> None:
        namespace, _, name = table.rpartition(".")
        if not name or not all(c.isalnum() or c in "_-" for c in name):
            raise TargetError(f"invalid Iceberg table name {table!r}: use [namespace.]name of letters, digits, _ and -")
        if not catalog_properties:
            if not warehouse:
                raise TargetError("the Iceberg target needs a catalog connection or a warehouse path for its "
                                  "embedded SQLite catalog")
            catalog_properties = embedded_catalog(warehouse)
        super().__init__(name, Storage(catalog_properties))
        self.namespace = namespace or DEFAULT_NAMESPACE
        self.identifier = f"{self.namespace}.{name}"
        self.warehouse = warehouse
        self.catalog_properties = dict(catalog_properties)
        self.tables = IcebergTables(catalog_name, {k: str(v) for k, v in self.catalog_properties.items()},
                                    self.namespace, self.identifier)
        self.catalog = self.tables.catalog
        self.rejects_identifier = self.tables.rejects_identifier
        self.ledger = Ledger(self.tables)

    def dataset(self) -> tuple[str, str]:
        """The catalog's warehouse location (else its URI without credentials), the identifier."""
        location = self.catalog_properties.get("warehouse") or re.sub(
            r"//[^/@]*@", "//", str(self.catalog_properties.get("uri", "")))
        return str(location), self.identifier

    def __repr__(self) -> str:
        return f"IcebergTarget({self.identifier!r}, catalog={self.catalog_properties.get('uri')!r})"

    def _load(self, identifier: str | None = None):
        return self.tables.load(identifier)

    def table_or_fail(self):
        return self.tables.table_or_fail()

    def ensure_schema(self, value_schema) -> None:
        try:
            self.tables.ensure_schema(value_schema)
            self.ledger.ensure()
        except OSError as exc:  # the warehouse cannot be written: say which, before Spark starts
            raise TargetError(f"Iceberg table {self.identifier}: cannot write its files under "
                              f"{self.dataset()[0]} ({exc}); check that the location (and, on an object store, "
                              "the bucket) exists and that the connection's credentials may write there") from exc

    def check_schema(self, value_schema) -> list[str]:
        return self.tables.check_schema(value_schema)

    def state(self) -> TableState:
        table = self._load()
        if table is None:
            return TableState(ends={}, batch_ids=frozenset(), token=None, exists=False)
        snapshots = batch_snapshots(table)
        raw = table.properties.get(COMMITTED_OFFSETS)
        if raw:
            ends = {(t, int(p)): int(e) for t, parts in json.loads(raw).items() for p, e in parts.items()}
        else:  # a table written before the property existed: fold the history once
            ends = committed_ends([record_of(self.table, s) for s in snapshots])
        current = table.current_snapshot()
        ids = {summary(s)[BATCH_ID] for s in snapshots} | {e.id for e in self.ledger.expired(table, BATCH, False)}
        return TableState(ends=ends, batch_ids=frozenset(ids), token=current.snapshot_id if current else None,
                          exists=bool(ids))

    def batch(self, batch_id: str) -> BatchRecord | None:
        table = self._load()
        for snapshot in batch_snapshots(table):
            if summary(snapshot)[BATCH_ID] == batch_id:
                return record_of(self.table, snapshot)
        entry = next((e for e in self.ledger.expired(table, BATCH) if e.id == batch_id), None)
        return BatchRecord.from_dict(entry.record) if entry is not None else None

    def batches(self) -> list[BatchRecord]:
        return self.ledger.records(self.table, self._load())

    def contents(self, since_ms: int | None = None) -> TableContents:
        """Batch records and data files of one snapshot, from the table read once (and the ledger, which only grows)."""
        return self.contents_of(self._load())

    def contents_of(self, table) -> TableContents:
        """`contents` of a table already loaded (the compaction's snapshot)."""
        records = self.ledger.records(self.table, table)
        batch_of = {int(r.extra["snapshot_id"]): r.batch_id for r in records if r.extra.get("snapshot_id")}
        return TableContents(records, table_files(table, self.identifier, batch_of, self.ledger.compactions(table)))

    def reject_files(self, batch_id: str) -> list[str]:
        return [local_path(p) for p in files_added_by(self._load(self.rejects_identifier), batch_id)]

    def snapshot(self, snapshot_id: int) -> dict | None:
        return snapshot_info(self._load(), snapshot_id)

    @staticmethod
    def _staging_root(table) -> str:
        """`<table location>/data/_logbus_staging` (a local path, or the object store's URI)."""
        return join(local_path(table.location()), "data", STAGING)

    def prepare_staging(self, batch_id: str, attempt: int | str) -> str:
        staging = join(self._staging_root(self.table_or_fail()), f"{batch_id}.{attempt}")
        self.storage.delete_dir(staging)
        self.storage.make_dirs(parent_of(staging))
        return staging

    def remove_attempts(self, batch_id: str, keep: str | None = None) -> None:
        """Other attempts' files are never referenced by a snapshot: delete them. The
        committed attempt's directory stays: the snapshot points at its data files."""
        from pyarrow.fs import FileType

        table = self._load()
        if table is None:
            return
        root = self._staging_root(table)
        attempts = [self.storage.location_of(root, e.path) for e in self.storage.entries(root)
                    if e.type == FileType.Directory and e.base_name.rsplit(".", 1)[0] == batch_id]
        if not attempts:
            return
        committed = self.batch(batch_id)
        keep_too = committed.extra.get("staging") if committed is not None else None
        for attempt in attempts:
            if attempt not in (keep, keep_too):
                self.storage.delete_dir(attempt)

    def publish(self, state: TableState, record: BatchRecord, staged: StagedBatch) -> bool:
        from pyiceberg.exceptions import CommitFailedException

        from airflow_provider_logbus.targets.iceberg_transaction import transaction

        table = self.table_or_fail()
        current = table.current_snapshot()
        if (current.snapshot_id if current else None) != state.token:
            return False
        ends = dict(state.ends)
        for r in record.ranges:
            ends[r.key] = r.end
        offsets: dict[str, dict[str, int]] = {}
        for (topic, partition), end in sorted(ends.items()):
            offsets.setdefault(topic, {})[str(partition)] = end
        tx = transaction(table)
        # no duplicate-file check: it opens every manifest, and the batch-id check and the
        # compare-and-swap already rule out adding an attempt's files twice
        tx.add_files(staged.data_files(), snapshot_properties=summary_of(record, staged),
                     check_duplicate_files=False)
        tx.set_properties({COMMITTED_OFFSETS: json.dumps(offsets, sort_keys=True)})
        try:
            tx.commit_transaction()  # asserts main is still at state.token
        except CommitFailedException as exc:
            logger.info("Iceberg commit of batch %s refused (%s)", record.batch_id, exc)
            return False
        return True

    def finish(self, record: BatchRecord) -> None:
        """Publish the batch's rejects into `<table>_rejects`, then its record into the
        ledger, each once."""
        publish_rejects(lambda: self._load(self.rejects_identifier), record, self.storage)
        committed = self.batch(record.batch_id)
        if committed is not None and committed.extra.get("snapshot_id"):
            self.ledger.append([ledger_entry(committed)], dedupe=False)  # no read: a commit stays cheap

    def write_audit(self, audit_id: str, report: dict) -> str:
        root = self.warehouse or local_path(self.table_or_fail().location())
        directory = join(root, "_audit", self.identifier)
        self.storage.make_dirs(directory)
        path = join(directory, f"{audit_id}.json")
        self.storage.write_json(path, report)
        return path

    def announcement(self) -> dict | None:
        table = self._load()
        raw = table.properties.get(ANNOUNCED) if table is not None else None
        return json.loads(raw) if raw else None

    def announce(self, expected: dict | None, new: dict) -> bool:
        """Both properties in one commit. The SQL catalog commits by swapping the metadata
        location only if it is still the one read, so a concurrent announcement (or any
        other commit) in between makes this one fail, and the caller reads again."""
        from pyiceberg.exceptions import CommitFailedException

        from airflow_provider_logbus.targets.iceberg_transaction import transaction

        table = self.table_or_fail()
        raw = table.properties.get(ANNOUNCED)
        if (json.loads(raw) if raw else None) != expected:
            return False
        try:
            with transaction(table) as tx:
                tx.set_properties({ANNOUNCED: json.dumps(new, sort_keys=True),
                                   COMPLETE_THROUGH: str(new["complete_through_ms"])})
        except CommitFailedException:
            return False
        return True

    def close(self) -> None:
        self.tables.close()


def ledger_entry(record: BatchRecord) -> LedgerEntry:
    """The ledger's copy of a committed batch's record (read from its snapshot)."""
    return LedgerEntry(BATCH, record.batch_id, int(record.extra["snapshot_id"]), record.committed_at,
                       record.to_dict())
