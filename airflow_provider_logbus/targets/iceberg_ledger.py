"""The ledger: `<table>_batches`, an Iceberg table that keeps every batch record, and
every compaction's account of which batch's rows its files hold, after the snapshots
whose summaries carried them first are expired.

A commit writes the batch record into its snapshot's summary — atomically with the data,
which is what makes the commit exactly-once — and then, like the rejects, appends it
here (`IcebergTarget.finish`, idempotent). A commit killed between the two leaves the
record in the summary only; readers take the union of summaries and ledger, and the
maintenance copies whatever the ledger lacks (`sync`) before it expires a snapshot, so
no record is ever only in an expired snapshot.

One row per entry: kind (`batch` or `compaction`), id (the batch id, or the compaction's
id), the snapshot that carried it, when, and the record as JSON — the same dictionary the
summary holds, so the two can never describe a batch differently.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from airflow_provider_logbus.targets.base import BatchRecord
from airflow_provider_logbus.targets.iceberg_batches import (
    BATCH_ID, batch_snapshots, compaction_snapshots, lineage_truncated, record_of, summary,
)
from airflow_provider_logbus.targets.iceberg_batches import COMPACTION as COMPACTION_SUMMARY
from airflow_provider_logbus.targets.iceberg_tables import IcebergTables

logger = logging.getLogger(__name__)

BATCH = "batch"
COMPACTION = "compaction"
APPEND_ATTEMPTS = 20


@dataclass(frozen=True)
class LedgerEntry:
    kind: str  # BATCH or COMPACTION
    id: str
    snapshot_id: int
    committed_at: str
    record: dict  # BatchRecord.to_dict(), or a compaction's {"hour_ms", "files": {path: {batch id: rows}}}


def ledger_schema():
    import pyarrow as pa

    return pa.schema([pa.field("kind", pa.string(), nullable=False), pa.field("id", pa.string(), nullable=False),
                      pa.field("snapshot_id", pa.int64(), nullable=False), pa.field("committed_at", pa.string()),
                      pa.field("record", pa.string(), nullable=False)])


class Ledger:
    """The `<table>_batches` table of one logbus Iceberg table."""

    def __init__(self, tables: IcebergTables) -> None:
        self.tables = tables
        self.identifier = f"{tables.identifier}_batches"

    def ensure(self) -> None:
        if self.tables.load(self.identifier) is None:
            self.tables.create(self.identifier, ledger_schema(), partitioned=False)
        self.tables.ensure_properties(self.identifier)

    def entries(self, kind: str | None = None, records: bool = True) -> list[LedgerEntry]:
        """Every entry (of `kind`), one per (kind, id): a row appended twice — a retried
        commit, two racing writers — counts once. `records=False` leaves the records out
        (empty), reading only the small columns."""
        return self._entries(self.tables.load(self.identifier), kind, records)

    @staticmethod
    def _entries(table, kind: str | None, records: bool) -> list[LedgerEntry]:
        if table is None or table.current_snapshot() is None:
            return []
        columns = ("kind", "id", "snapshot_id", "committed_at") + (("record",) if records else ())
        seen: dict[tuple[str, str], LedgerEntry] = {}
        for row in table.scan(selected_fields=columns).to_arrow().to_pylist():
            if kind is None or row["kind"] == kind:
                seen.setdefault((row["kind"], row["id"]), LedgerEntry(
                    row["kind"], row["id"], int(row["snapshot_id"]), row["committed_at"] or "",
                    json.loads(row["record"]) if records else {}))
        return sorted(seen.values(), key=lambda e: (e.kind, e.committed_at, e.id))

    def expired(self, table, kind: str, records: bool = True) -> list[LedgerEntry]:
        """The entries of `kind` whose snapshots `table` no longer has: expired. None —
        and the ledger is not even read — while the table's lineage still reaches its
        first snapshot, as the summaries then say everything. An entry whose snapshot the
        table still has but not in its lineage (rolled back) is not the table's."""
        if not lineage_truncated(table):
            return []
        known = {s.snapshot_id for s in table.metadata.snapshots}
        return [e for e in self.entries(kind, records) if e.snapshot_id not in known]

    def records(self, table_name: str, table) -> list[BatchRecord]:
        """One record per batch of `table`: from the current lineage's snapshot summaries,
        and from the ledger for the batches whose snapshots were expired."""
        records = {r.batch_id: r for r in (BatchRecord.from_dict(e.record) for e in self.expired(table, BATCH))}
        records.update((summary(s)[BATCH_ID], record_of(table_name, s)) for s in batch_snapshots(table))
        return sorted(records.values(), key=lambda r: (r.interval_end, r.batch_id))

    def compactions(self, table) -> dict[str, dict[str, int]]:
        """Rows per batch in every file a compaction wrote ({path: {batch id: rows}}),
        from the lineage's compaction snapshots and, for expired ones, from the ledger."""
        files: dict[str, dict[str, int]] = {}
        for entry in self.expired(table, COMPACTION):
            files.update(entry.record["files"])
        for snapshot in compaction_snapshots(table):
            files.update(json.loads(summary(snapshot)[COMPACTION_SUMMARY])["files"])
        return files

    def ids(self, kind: str = BATCH) -> set[str]:
        """The ids of every entry of `kind` the ledger holds."""
        return {e.id for e in self.entries(kind, records=False)}

    def append(self, entries: list[LedgerEntry], dedupe: bool = True) -> int:
        """Add the entries the ledger lacks, in one snapshot; the number added. A commit
        refused by the catalog (another writer came first) reads the ledger again, so
        two writers of one entry add it once. `dedupe=False` (a load's commit) appends
        without reading the ledger first: a retry may add a row twice, which readers
        and the ledger's compaction count once."""
        import pyarrow as pa
        from pyiceberg.exceptions import CommitFailedException

        from airflow_provider_logbus.targets.iceberg_transaction import transaction

        for _ in range(APPEND_ATTEMPTS):
            table = self.tables.load(self.identifier)
            if table is None:  # a table from before the ledger: create it
                self.ensure()
                continue
            present = {(e.kind, e.id) for e in self._entries(table, None, records=False)} if dedupe else set()
            missing = {(e.kind, e.id): e for e in entries if (e.kind, e.id) not in present}
            if not missing:
                return 0
            rows = pa.Table.from_pylist([{
                "kind": e.kind, "id": e.id, "snapshot_id": e.snapshot_id, "committed_at": e.committed_at,
                "record": json.dumps(e.record, sort_keys=True)} for e in missing.values()], schema=ledger_schema())
            tx = transaction(table)
            tx.append(rows)
            try:
                tx.commit_transaction()  # asserts the ledger is still at the snapshot read
                return len(missing)
            except CommitFailedException:
                continue
        raise RuntimeError(f"could not append to {self.identifier}: {APPEND_ATTEMPTS} concurrent commits in a row")

    def compact(self) -> bool:
        """Rewrite the ledger's files into one (an append per batch leaves a small file
        per batch). True when it rewrote; a concurrent append makes it give up until the
        next run: nothing is lost, the ledger only stays in more files."""
        from pyiceberg.exceptions import CommitFailedException

        from airflow_provider_logbus.targets.iceberg_transaction import transaction

        table = self.tables.load(self.identifier)
        if table is None or table.current_snapshot() is None:
            return False
        if len(list(table.scan().plan_files())) <= 1:
            return False
        import pyarrow as pa

        unique = {(r["kind"], r["id"]): r for r in table.scan().to_arrow().to_pylist()}
        tx = transaction(table)
        tx.overwrite(pa.Table.from_pylist(list(unique.values()), schema=ledger_schema()))
        try:
            tx.commit_transaction()
        except CommitFailedException:
            logger.info("ledger %s: a load appended meanwhile; compacting it next time", self.identifier)
            return False
        return True
