"""The Apache Iceberg target: a batch is one snapshot, and its offsets travel inside it.

A table `<namespace>.<table>` (namespace `logbus` unless the name has one) holds the
logbus columns (topic, partition, offset, timestamp, key) and the declared value fields,
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

Rejected values go to `<table>_rejects` (topic, partition, offset, timestamp, value,
error), one snapshot per batch with the same `logbus.batch-id`, after the main commit
and idempotently (a retry that finds the batch committed finishes its rejects).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from airflow_provider_logbus.plan import ranges_from_json, ranges_to_json
from airflow_provider_logbus.staged import StagedBatch, reject_files, write_json_atomic
from airflow_provider_logbus.targets.base import (BatchRecord, CommitTarget, TableContents, TableFile, TableState,
                                                  TargetError, committed_ends)

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "logbus"
HOUR_MS = 3_600_000
STAGING = "_logbus_staging"
PREFIX = "logbus."
COMMITTED_OFFSETS = "logbus.committed-offsets"
COMPLETE_THROUGH = "logbus.complete-through"
ANNOUNCED = "logbus.announced"
NO_REBASE = {"commit.retry.num-retries": "0"}
# Properties every logbus table gets (at creation, or added by the next load): no rebase
# of a refused commit (module docstring); old metadata files deleted after a commit, or
# a year of hourly batches leaves ~60 GB of them (BENCHMARKS.md); manifests merged on
# append, so planning and commits do not open one manifest per batch ever written.
TABLE_PROPERTIES = {**NO_REBASE, "write.metadata.delete-after-commit.enabled": "true",
                    "write.metadata.previous-versions-max": "100", "commit.manifest-merge.enabled": "true"}


def embedded_catalog(warehouse: str) -> dict[str, str]:
    """A SQL catalog on a SQLite file under the warehouse: no server to run."""
    root = Path(warehouse).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{root / '_iceberg_catalog.db'}", "warehouse": f"file://{root}"}


def logbus_columns():
    import pyarrow as pa

    return [pa.field("topic", pa.string()), pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
            pa.field("timestamp", pa.timestamp("us", tz="UTC")), pa.field("key", pa.binary())]


def rejects_schema():
    import pyarrow as pa

    return pa.schema([*logbus_columns(), pa.field("value", pa.binary()), pa.field("error", pa.string())])


def small_types(schema):
    """The table's schema as plain Arrow types (pyiceberg reads strings, binaries and
    lists as their `large_` variants), without field ids, for comparing with a
    declaration."""
    import pyarrow as pa

    def plain(t):
        if pa.types.is_large_string(t):
            return pa.string()
        if pa.types.is_large_binary(t):
            return pa.binary()
        if pa.types.is_large_list(t) or pa.types.is_list(t):
            return pa.list_(plain(t.value_type))
        if pa.types.is_map(t):
            return pa.map_(plain(t.key_type), plain(t.item_type))
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, plain(f.type), f.nullable) for f in t])
        return t

    return pa.schema([pa.field(f.name, plain(f.type), f.nullable) for f in schema])


def nested_optional(schema):
    """Top-level required fields stay required; fields inside structs, lists and maps
    become optional, because the load job enforces nested requirements while decoding
    but Spark writes nested Parquet fields as optional (pyiceberg's file check would
    refuse a required table field over an optional file field)."""
    import pyarrow as pa

    def relax(t):
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, relax(f.type), True) for f in t])
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return pa.list_(pa.field("element", relax(t.value_type), True))
        if pa.types.is_map(t):
            return pa.map_(t.key_type, pa.field("value", relax(t.item_type), True))
        return t

    return pa.schema([pa.field(f.name, relax(f.type), f.nullable) for f in schema])


def local_path(location: str) -> str:
    return location[len("file://"):] if location.startswith("file://") else location


def _hour_reader(table, spec_id: int):
    """A data file's hour (ms): its `hour(timestamp)` partition value under spec
    `spec_id`, else (a file of an unpartitioned spec) its lower bound of `timestamp`."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.transforms import HourTransform

    field_id = table.schema().find_field("timestamp").field_id
    spec = table.specs()[spec_id]
    position = next((i for i, f in enumerate(spec.fields)
                     if f.source_id == field_id and isinstance(f.transform, HourTransform)), None)
    kind = table.schema().find_type(field_id)

    def hour_of(data) -> int:
        if position is not None and data.partition[position] is not None:
            return int(data.partition[position]) * HOUR_MS
        micros = from_bytes(kind, data.lower_bounds[field_id])
        return micros // 1000 - micros // 1000 % HOUR_MS

    return hour_of


def _load_catalog(name: str, properties: dict[str, str], attempts: int = 3):
    """The catalog. A SQL catalog's first use creates its own tables, and loads starting
    at once on a new database race to create them: PostgreSQL refuses all but one (a
    duplicate row of its type catalog, or a relation that already exists). Whoever
    lost finds the tables made when it tries again."""
    from pyiceberg.catalog import load_catalog

    for attempt in range(1, attempts + 1):
        try:
            return load_catalog(name, **properties)
        except Exception as exc:
            if attempt == attempts or not _lost_catalog_creation_race(exc):
                raise
            logger.info("catalog %s: its tables were being created by another load (%s); trying again", name,
                        type(exc).__name__)
            time.sleep(0.2 * attempt)


def _lost_catalog_creation_race(exc: Exception) -> bool:
    """PostgreSQL says IntegrityError or ProgrammingError when two loads create the
    catalog's tables at once; SQLite says OperationalError ("already exists", or
    "database is locked" while the other holds the write lock)."""
    try:
        from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
    except ImportError:  # not a SQL catalog's error
        return False
    if isinstance(exc, OperationalError):
        return "already exists" in str(exc) or "locked" in str(exc)
    return isinstance(exc, (IntegrityError, ProgrammingError))


class IcebergTarget(CommitTarget):
    layout = "iceberg"

    def __init__(self, table: str, *, catalog_properties: dict[str, Any] | None = None,
                 warehouse: str | None = None, catalog_name: str = "logbus") -> None:
        namespace, _, name = table.rpartition(".")
        if not name or not all(c.isalnum() or c in "_-" for c in name):
            raise TargetError(f"invalid Iceberg table name {table!r}: use [namespace.]name of letters, digits, _ and -")
        super().__init__(name)
        self.namespace = namespace or DEFAULT_NAMESPACE
        self.identifier = f"{self.namespace}.{name}"
        self.rejects_identifier = f"{self.identifier}_rejects"
        if not catalog_properties:
            if not warehouse:
                raise TargetError("the Iceberg target needs a catalog connection or a warehouse path for its "
                                  "embedded SQLite catalog")
            catalog_properties = embedded_catalog(warehouse)
        self.warehouse = warehouse
        self.catalog_properties = dict(catalog_properties)
        self.catalog = _load_catalog(catalog_name, {k: str(v) for k, v in self.catalog_properties.items()})

    def dataset(self) -> tuple[str, str]:
        """The catalog's warehouse location (else its URI without credentials) and the
        table's identifier."""
        location = self.catalog_properties.get("warehouse") or re.sub(
            r"//[^/@]*@", "//", str(self.catalog_properties.get("uri", "")))
        return str(location), self.identifier

    def __repr__(self) -> str:
        return f"IcebergTarget({self.identifier!r}, catalog={self.catalog_properties.get('uri')!r})"

    # ----------------------------------------------------------------- the table

    def _load(self, identifier: str | None = None):
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(identifier or self.identifier)
        except NoSuchTableError:
            return None

    def table_or_fail(self):
        table = self._load()
        if table is None:
            raise TargetError(f"Iceberg table {self.identifier} does not exist yet: the load task creates it from "
                              "the declared schema")
        return table

    def _create(self, identifier: str, schema, partitioned: bool) -> None:
        """Create the table, or accept the one a concurrent first load created meanwhile:
        several runs of a new table start at once (a backfill, a manual trigger beside
        the schedule), and each found no table a moment ago. The catalog refuses all
        creations but one — the SQL catalog with `CommitFailedException("Table already
        exists")` (the create transaction's assert-create requirement), a lost insert
        race with `TableAlreadyExistsError` — so a refusal with the table now there is
        success; the caller checks that table against the declaration."""
        from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError
        from pyiceberg.transforms import HourTransform

        self._create_namespace()
        try:
            with self.catalog.create_table_transaction(identifier, schema=schema, properties=TABLE_PROPERTIES) as tx:
                if partitioned:
                    with tx.update_spec() as spec:
                        spec.add_field("timestamp", HourTransform(), "timestamp_hour")
            logger.info("created Iceberg table %s", identifier)
        except (TableAlreadyExistsError, CommitFailedException) as exc:
            if self._load(identifier) is None:
                raise
            logger.info("Iceberg table %s was created by a concurrent load (%s); using it", identifier, exc)

    def _create_namespace(self) -> None:
        """`create_namespace_if_not_exists`, also when another load creates it between
        the SQL catalog's existence check and its insert (which then fails on the
        catalog's primary key rather than with `NamespaceAlreadyExistsError`)."""
        try:
            self.catalog.create_namespace_if_not_exists(self.namespace)
        except Exception:
            if not self.catalog.namespace_exists(self.namespace):
                raise

    def ensure_schema(self, value_schema) -> None:
        import pyarrow as pa

        from airflow_provider_logbus.schema import check_evolution

        if value_schema is None:
            raise TargetError(f"the Iceberg table {self.identifier} needs a declared value schema (Spark DDL or a "
                              "JSON schema file): a table's schema is not inferred from a sample")
        declared = nested_optional(pa.schema([*logbus_columns(), *value_schema]))
        table = self._load()
        if table is None:
            self._create(self.identifier, declared, partitioned=True)
            table = self.table_or_fail()
        added = check_evolution(small_types(table.schema().as_arrow()), declared)
        if added:
            from pyiceberg.exceptions import CommitFailedException

            for _ in range(10):
                try:
                    with table.update_schema() as update:
                        update.union_by_name(pa.schema([declared.field(n) for n in added]))
                    logger.info("Iceberg table %s gained optional field(s) %s", self.identifier, ", ".join(added))
                    break
                except CommitFailedException:
                    table = self.table_or_fail()
                    if not check_evolution(small_types(table.schema().as_arrow()), declared):
                        break
        if self._load(self.rejects_identifier) is None:
            self._create(self.rejects_identifier, rejects_schema(), partitioned=False)
        for identifier in (self.identifier, self.rejects_identifier):
            self._ensure_properties(identifier)

    def _ensure_properties(self, identifier: str) -> None:
        """Tables created by an earlier version get today's `TABLE_PROPERTIES`."""
        from pyiceberg.exceptions import CommitFailedException

        table = self._load(identifier)
        missing = {k: v for k, v in TABLE_PROPERTIES.items() if table.properties.get(k) != v}
        if missing:
            try:
                with table.transaction() as tx:
                    tx.set_properties(missing)
            except CommitFailedException:
                pass  # a concurrent load is doing the same; the next one checks again

    # ----------------------------------------------------------------- reading

    @staticmethod
    def _summary(snapshot) -> dict[str, str]:
        return dict(snapshot.summary.additional_properties) if snapshot.summary else {}

    def _batch_snapshots(self, table) -> list:
        """Snapshots of the current lineage that carry a batch, oldest first."""
        if table is None or table.current_snapshot() is None:
            return []
        from pyiceberg.table.snapshots import ancestors_of

        chain = list(ancestors_of(table.current_snapshot(), table.metadata))
        return [s for s in reversed(chain) if PREFIX + "batch-id" in self._summary(s)]

    def _record_of(self, snapshot) -> BatchRecord:
        s = self._summary(snapshot)
        planned = s.get(PREFIX + "planned-ranges")
        return BatchRecord(
            table=self.table, batch_id=s[PREFIX + "batch-id"], interval_start=s.get(PREFIX + "interval-start", ""),
            interval_end=s.get(PREFIX + "interval-end", ""), run_id=s.get(PREFIX + "run-id", ""),
            ranges=ranges_from_json(s.get(PREFIX + "ranges", "[]")), counts=json.loads(s.get(PREFIX + "counts", "[]")),
            row_count=int(s.get(PREFIX + "row-count", 0)), committed_at=s.get(PREFIX + "committed-at", ""),
            attempt=s.get(PREFIX + "attempt", ""), window_ms=int(s.get(PREFIX + "window-ms", 600_000)),
            rejected=json.loads(s.get(PREFIX + "rejected", "[]")),
            rejected_count=int(s.get(PREFIX + "rejected-count", 0)), schema=s.get(PREFIX + "schema"),
            schema_source=s.get(PREFIX + "schema-source"), planned_ranges=ranges_from_json(planned) if planned else None,
            extra={"snapshot_id": snapshot.snapshot_id, "staging": s.get(PREFIX + "staging", "")})

    def state(self) -> TableState:
        table = self._load()
        if table is None:
            return TableState(ends={}, batch_ids=frozenset(), token=None, exists=False)
        snapshots = self._batch_snapshots(table)
        raw = table.properties.get(COMMITTED_OFFSETS)
        if raw:
            ends = {(t, int(p)): int(e) for t, parts in json.loads(raw).items() for p, e in parts.items()}
        else:  # a table written before the property existed: fold the history once
            ends = committed_ends([self._record_of(s) for s in snapshots])
        current = table.current_snapshot()
        return TableState(ends=ends, batch_ids=frozenset(self._summary(s)[PREFIX + "batch-id"] for s in snapshots),
                          token=current.snapshot_id if current else None, exists=bool(snapshots))

    def batch(self, batch_id: str) -> BatchRecord | None:
        for snapshot in self._batch_snapshots(self._load()):
            if self._summary(snapshot)[PREFIX + "batch-id"] == batch_id:
                return self._record_of(snapshot)
        return None

    def batches(self) -> list[BatchRecord]:
        records = [self._record_of(s) for s in self._batch_snapshots(self._load())]
        return sorted(records, key=lambda r: (r.interval_end, r.batch_id))

    def contents(self, since_ms: int | None = None) -> TableContents:
        """Batch records and data files of one snapshot: both come from the table read once."""
        from pyiceberg.manifest import DataFileContent

        table = self._load()
        snapshots = self._batch_snapshots(table)
        records = sorted((self._record_of(s) for s in snapshots), key=lambda r: (r.interval_end, r.batch_id))
        batch_of = {s.snapshot_id: self._summary(s)[PREFIX + "batch-id"] for s in snapshots}
        current = table.current_snapshot() if table is not None else None
        files = []
        for manifest in current.manifests(table.io) if current is not None else ():
            hour_of = _hour_reader(table, manifest.partition_spec_id)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                data = entry.data_file
                if data.content == DataFileContent.EQUALITY_DELETES:
                    raise TargetError(f"{self.identifier} has equality deletes ({data.file_path}): the audit cannot "
                                      "count the rows they remove without reading the data; compact the table")
                sign = -1 if data.content == DataFileContent.POSITION_DELETES else 1
                files.append(TableFile(data.file_path, hour_of(data), sign * data.record_count,
                                       batch_of.get(entry.snapshot_id)))
        return TableContents(records, files)

    # ----------------------------------------------------------------- writing

    def _staging_root(self) -> Path:
        location = local_path(self.table_or_fail().location())
        return Path(location) / "data" / STAGING

    def prepare_staging(self, batch_id: str, attempt: int | str) -> str:
        staging = self._staging_root() / f"{batch_id}.{attempt}"
        if staging.exists():
            shutil.rmtree(staging)
        staging.parent.mkdir(parents=True, exist_ok=True)
        return str(staging)

    def remove_attempts(self, batch_id: str, keep: str | None = None) -> None:
        """Other attempts' files are never referenced by a snapshot: delete them. The
        committed attempt's directory stays: the snapshot points at its data files."""
        table = self._load()
        root = Path(local_path(table.location())) / "data" / STAGING if table is not None else None
        if root is None or not root.is_dir():
            return
        committed = self.batch(batch_id)
        keep_too = committed.extra.get("staging") if committed is not None else None
        for child in root.iterdir():
            if child.name.rsplit(".", 1)[0] == batch_id and child.is_dir() and str(child) not in (keep, keep_too):
                shutil.rmtree(child, ignore_errors=True)

    def _summary_of(self, record: BatchRecord, staged: StagedBatch) -> dict[str, str]:
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

    def publish(self, state: TableState, record: BatchRecord, staged: StagedBatch) -> bool:
        from pyiceberg.exceptions import CommitFailedException

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
        tx = table.transaction()
        # no duplicate-file check: it opens every manifest, and the batch-id check and the
        # compare-and-swap already rule out adding an attempt's files twice
        tx.add_files([str(p) for p in staged.data_files()], snapshot_properties=self._summary_of(record, staged),
                     check_duplicate_files=False)
        tx.set_properties({COMMITTED_OFFSETS: json.dumps(offsets, sort_keys=True)})
        try:
            tx.commit_transaction()  # asserts main is still at state.token
        except CommitFailedException as exc:
            logger.info("Iceberg commit of batch %s refused (%s)", record.batch_id, exc)
            return False
        return True

    def finish(self, record: BatchRecord) -> None:
        """Publish the batch's rejects into `<table>_rejects`, once."""
        staging = record.extra.get("staging")
        rejects_table = self._load(self.rejects_identifier)
        if not staging or rejects_table is None or not os.path.isdir(staging):
            return
        staged_rejects = reject_files(Path(staging))
        for _ in range(10):
            rejects_table = self._load(self.rejects_identifier)
            done = any(self._summary(s).get(PREFIX + "batch-id") == record.batch_id
                       for s in rejects_table.metadata.snapshots)
            if done or not staged_rejects:
                return
            from pyiceberg.exceptions import CommitFailedException

            tx = rejects_table.transaction()
            tx.add_files([str(p) for p in staged_rejects],
                         snapshot_properties={PREFIX + "batch-id": record.batch_id,
                                              PREFIX + "rejected-count": str(record.rejected_count)})
            try:
                tx.commit_transaction()
                return
            except CommitFailedException:
                continue

    # ----------------------------------------------------------------- audit

    def write_audit(self, audit_id: str, report: dict) -> str:
        root = Path(self.warehouse) if self.warehouse else Path(local_path(self.table_or_fail().location()))
        directory = root / "_audit" / self.identifier
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{audit_id}.json"
        write_json_atomic(path, report)
        return str(path)

    def announcement(self) -> dict | None:
        table = self._load()
        raw = table.properties.get(ANNOUNCED) if table is not None else None
        return json.loads(raw) if raw else None

    def announce(self, expected: dict | None, new: dict) -> bool:
        """Both properties in one commit. The SQL catalog commits by swapping the metadata
        location only if it is still the one read, so a concurrent announcement (or any
        other commit) in between makes this one fail, and the caller reads again."""
        from pyiceberg.exceptions import CommitFailedException

        table = self.table_or_fail()
        raw = table.properties.get(ANNOUNCED)
        if (json.loads(raw) if raw else None) != expected:
            return False
        try:
            with table.transaction() as tx:
                tx.set_properties({ANNOUNCED: json.dumps(new, sort_keys=True),
                                   COMPLETE_THROUGH: str(new["complete_through_ms"])})
        except CommitFailedException:
            return False
        return True

    def close(self) -> None:
        engine = getattr(self.catalog, "engine", None)
        if engine is not None:
            engine.dispose()
