"""The catalog and the two tables a logbus Iceberg target owns — `<namespace>.<table>`
and `<namespace>.<table>_rejects`: loading the catalog (also while another load is
creating its tables), creating the tables (also while another load creates them),
their schema and its evolution, and the properties every logbus table carries. The
commit protocol on top of them is `targets/iceberg.py`'s.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from airflow_provider_logbus.targets.base import TargetError

logger = logging.getLogger(__name__)

NO_REBASE = {"commit.retry.num-retries": "0"}
# Properties every logbus table gets (at creation, or added by the next load): no rebase
# of a refused commit (targets/iceberg.py); old metadata files deleted after a commit, or
# a year of hourly batches leaves ~60 GB of them (BENCHMARKS.md); manifests merged on
# append, so planning and commits do not open one manifest per batch ever written, into
# manifests of at most 64 KiB (about a week of compacted hours), not Iceberg's 8 MiB:
# merged in time order, a small manifest covers a few days, so a reader of one hour and
# the compaction of one hour touch one small manifest, where one manifest holding every
# hour of the year was read whole by each (BENCHMARKS.md, the year run).
MANIFEST_TARGET_BYTES = 64 << 10
TABLE_PROPERTIES = {**NO_REBASE, "write.metadata.delete-after-commit.enabled": "true",
                    "write.metadata.previous-versions-max": "100", "commit.manifest-merge.enabled": "true",
                    "commit.manifest.target-size-bytes": str(MANIFEST_TARGET_BYTES)}
# The table's own documentation (what Spark's DESCRIBE and catalogs show as its comment,
# and the `offset` column's doc): its row key. Rows loaded before per-record offsets
# keep their entries' offsets (docs/provider.md, "The Spark side").
OFFSET_DOC = ("the message's own offset in its partition (its entry's byte position plus its index in the entry); "
              "(topic, partition, offset) is the row key")
ROW_KEY = {"comment": "Messages of a logbus topic, each loaded once; (topic, partition, offset) is the row key. Rows "
                      "loaded before per-record offsets share their producer batch's or compressed set's offset "
                      "(docs/provider.md)."}


def embedded_catalog(warehouse: str) -> dict[str, str]:
    """A SQL catalog on a SQLite file under the warehouse: no server to run. The file
    needs a local warehouse; a bucket needs a catalog connection."""
    if "://" in warehouse and not warehouse.startswith("file://"):
        raise TargetError(f"the embedded Iceberg catalog keeps its SQLite file under the warehouse, so {warehouse} "
                          "cannot hold it: define a catalog connection (type logbus_iceberg, extra "
                          f'{{"warehouse": "{warehouse}"}}) as docs/provider.md "Object storage" shows')
    root = Path(warehouse.removeprefix("file://")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{root / '_iceberg_catalog.db'}", "warehouse": f"file://{root}"}


HEADERS_DOC = ("the Kafka record's headers (key, value) in order; empty for a message without headers, null for "
               "rows loaded before the column existed")


def logbus_columns():
    """The columns every row has, before its value's: the message's place, timestamp, key
    and Kafka record headers (`broker/common/columns_arrow.py`)."""
    import pyarrow as pa

    return [pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
            pa.field("offset", pa.int64(), metadata={"doc": OFFSET_DOC}),
            pa.field("timestamp", pa.timestamp("us", tz="UTC")), pa.field("key", pa.binary()),
            pa.field("headers", pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
                     metadata={"doc": HEADERS_DOC})]


def table_value_fields(value_schema):
    """The value fields as the load job writes them: a field named like a logbus column
    (or `logbus_hour`) is `value_<name>` (`spark/decode.py`, `decode_json`)."""
    taken = {f.name for f in logbus_columns()} | {"logbus_hour"}
    return [f.with_name(f"value_{f.name}") if f.name in taken else f for f in value_schema]


def table_schema(value_schema):
    """The table's schema for a declared value schema (a `pyarrow.Schema`), as the load
    creates or evolves it."""
    import pyarrow as pa

    return nested_optional(stored_types(pa.schema([*logbus_columns(), *table_value_fields(value_schema)])))


def stored_types(schema):
    """`schema` with the types Iceberg stores: it has no 8- or 16-bit integers, and
    pyiceberg makes a tinyint or smallint column int. Compared as declared, such a
    table refused its second load ("changes type from int to smallint")."""
    import pyarrow as pa

    def stored(t):
        if pa.types.is_int8(t) or pa.types.is_int16(t):
            return pa.int32()
        if pa.types.is_struct(t):
            return pa.struct([f.with_type(stored(f.type)) for f in t])
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return pa.list_(t.value_field.with_type(stored(t.value_type)))
        if pa.types.is_map(t):
            return pa.map_(t.key_field.with_type(stored(t.key_type)), t.item_field.with_type(stored(t.item_type)))
        return t

    return pa.schema([f.with_type(stored(f.type)) for f in schema])


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

    return pa.schema([f.with_type(relax(f.type)) for f in schema])  # a field's doc (metadata) stays


def local_path(location: str) -> str:
    return location[len("file://"):] if location.startswith("file://") else location


def load_catalog_retrying(name: str, properties: dict[str, str], attempts: int = 3):
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


class IcebergTables:
    """The catalog connection and the target's tables, by identifier."""

    def __init__(self, catalog_name: str, catalog_properties: dict[str, str], namespace: str, identifier: str) -> None:
        self.namespace = namespace
        self.identifier = identifier
        self.rejects_identifier = f"{identifier}_rejects"
        self.catalog = load_catalog_retrying(catalog_name, catalog_properties)

    def load(self, identifier: str | None = None):
        """The table (by default the main one), or None when it does not exist."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(identifier or self.identifier)
        except NoSuchTableError:
            return None

    def table_or_fail(self):
        table = self.load()
        if table is None:
            raise TargetError(f"Iceberg table {self.identifier} does not exist yet: the load task creates it from "
                              "the declared schema")
        return table

    def create(self, identifier: str, schema, partitioned: bool, properties: dict[str, str] = TABLE_PROPERTIES) -> None:
        """Create the table, or accept the one a concurrent first load created meanwhile:
        several runs of a new table start at once (a backfill, a manual trigger beside
        the schedule), and each found no table a moment ago. The catalog refuses all
        creations but one — the SQL catalog with `CommitFailedException("Table already
        exists")` (the create transaction's assert-create requirement), a lost insert
        race with `TableAlreadyExistsError` — so a refusal with the table now there is
        success; the caller checks that table against the declaration."""
        from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError
        from pyiceberg.transforms import HourTransform

        self.create_namespace()
        try:
            with self.catalog.create_table_transaction(identifier, schema=schema, properties=properties) as tx:
                if partitioned:
                    with tx.update_spec() as spec:
                        spec.add_field("timestamp", HourTransform(), "timestamp_hour")
            logger.info("created Iceberg table %s", identifier)
        except (TableAlreadyExistsError, CommitFailedException) as exc:
            if self.load(identifier) is None:
                raise
            logger.info("Iceberg table %s was created by a concurrent load (%s); using it", identifier, exc)

    def create_namespace(self) -> None:
        """`create_namespace_if_not_exists`, also when another load creates it between
        the SQL catalog's existence check and its insert (which then fails on the
        catalog's primary key rather than with `NamespaceAlreadyExistsError`)."""
        try:
            self.catalog.create_namespace_if_not_exists(self.namespace)
        except Exception:
            if not self.catalog.namespace_exists(self.namespace):
                raise

    def ensure_schema(self, value_schema) -> None:
        if value_schema is None:
            raise TargetError(f"the Iceberg table {self.identifier} needs a declared value schema (Spark DDL or a "
                              "JSON schema file): a table's schema is not inferred from a sample")
        declared = table_schema(value_schema)
        if self.load() is None:
            self.create(self.identifier, declared, partitioned=True, properties={**TABLE_PROPERTIES, **ROW_KEY})
        self._check_headers_column()
        self.evolve(self.identifier, declared)
        if self.load(self.rejects_identifier) is None:
            self.create(self.rejects_identifier, rejects_schema(), partitioned=False)
        self.evolve(self.rejects_identifier, nested_optional(rejects_schema()))
        self.ensure_properties(self.identifier, {**TABLE_PROPERTIES, **ROW_KEY})
        self.ensure_properties(self.rejects_identifier)
        for identifier in (self.identifier, self.rejects_identifier):
            self.document_offset(identifier)

    def check_schema(self, value_schema) -> list[str]:
        """What `ensure_schema` would add for `value_schema`, changing nothing: the
        columns to add ([] also for a table not created yet); `SchemaError` if the table
        cannot take it."""
        from airflow_provider_logbus.schema import check_evolution

        table = self.load()
        if table is None:
            return []
        return check_evolution(small_types(table.schema().as_arrow()), table_schema(value_schema))

    def evolve(self, identifier: str, declared) -> None:
        """Add to the table the optional fields `declared` has and it lacks (tables written
        before a column existed — `headers` — gain it this way; their rows read null), and
        widen or make optional the columns `declared` widens or makes optional."""
        import pyarrow as pa
        from pyiceberg.exceptions import CommitFailedException

        from airflow_provider_logbus.schema import check_evolution

        for _ in range(10):
            table = self.load(identifier)
            added = check_evolution(small_types(table.schema().as_arrow()), declared)
            if not added:
                return
            try:
                with table.update_schema() as update:
                    update.union_by_name(pa.schema([declared.field(n) for n in added]))
                logger.info("Iceberg table %s gained, widened or made optional field(s) %s", identifier,
                            ", ".join(added))
                return
            except CommitFailedException:
                continue  # a concurrent load evolved it: look again

    def _check_headers_column(self) -> None:
        """A table that already has a `headers` column holding a JSON field (written before
        record headers were loaded) cannot take the record headers under that name."""
        import pyarrow as pa

        from airflow_provider_logbus.schema import SchemaError

        current = small_types(self.table_or_fail().schema().as_arrow())
        expected = small_types(pa.schema([logbus_columns()[-1]])).field("headers")
        if "headers" in current.names and current.field("headers").type != expected.type:
            raise SchemaError(
                f"Iceberg table {self.identifier}: its column headers ({current.field('headers').type}) holds a JSON "
                "field, and loads now write the Kafka record headers there and that field as value_headers "
                f"(docs/provider.md, \"Record headers\"); rename it first, keeping its rows: ALTER TABLE "
                f"{self.identifier} RENAME COLUMN headers TO value_headers")

    def ensure_properties(self, identifier: str, properties: dict[str, str] = TABLE_PROPERTIES) -> None:
        """Tables created by an earlier version get today's `properties`."""
        from pyiceberg.exceptions import CommitFailedException

        table = self.load(identifier)
        missing = {k: v for k, v in properties.items() if table.properties.get(k) != v}
        if missing:
            try:
                with table.transaction() as tx:
                    tx.set_properties(missing)
            except CommitFailedException:
                pass  # a concurrent load is doing the same; the next one checks again

    def document_offset(self, identifier: str) -> None:
        """Tables created by an earlier version get the `offset` column's doc."""
        from pyiceberg.exceptions import CommitFailedException

        table = self.load(identifier)
        if table.schema().find_field("offset").doc != OFFSET_DOC:
            try:
                with table.update_schema() as update:
                    update.update_column("offset", doc=OFFSET_DOC)
            except CommitFailedException:
                pass  # as in `ensure_properties`

    def close(self) -> None:
        engine = getattr(self.catalog, "engine", None)
        if engine is not None:
            engine.dispose()
