"""Loads whose declared schema is a registry subject's latest version (`schema_subject`),
and the DAG-side compatibility check (`LogbusSchemaCheckOperator`): a real `logbus
schema-registry`, confluent_kafka's AvroSerializer, real brokers, the hourly DAG's
snapshot, load and commit operators into an Iceberg table (embedded catalog), the load's
Spark job on real Spark in this process."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from airflow_provider_logbus.operators.commit import LogbusCommitOperator
from airflow_provider_logbus.operators.schema_check import LogbusSchemaCheckOperator, LogbusSchemaIncompatibleError
from airflow_provider_logbus.operators.snapshot import LogbusOffsetSnapshotOperator
from airflow_provider_logbus.operators.spark_load import LogbusSparkLoadOperator
from airflow_provider_logbus.schema import SchemaError
from airflow_provider_logbus.plan import ranges_from_json
from airflow_provider_logbus.registry_access import RegistryAccess, RegistryUnavailable
from airflow_provider_logbus.schema.registry import latest_version
from airflow_provider_logbus.spark.load_job import arguments, run_load
from airflow_provider_logbus.targets.iceberg import IcebergTarget
from broker.client.producer import Producer
from harness.process import free_port, wait_until
from harness.registry import RegistryProcess
from tests.registry import schemas as s

from .conftest import use_logbus_connection
from .helpers import FakeTaskInstance
from .test_schema_and_rejects import _visible

pytestmark = pytest.mark.slow

TOPIC = TABLE = "events"
SUBJECT = f"{TOPIC}-value"
OPTIONAL_B = {"name": "b", "type": ["null", "string"], "default": None}
A_LONG = {"name": "a", "type": "long", "default": 0}


@pytest.fixture(scope="module")
def registry(module_cluster, tmp_path_factory):
    started = RegistryProcess(module_cluster.zookeeper, tmp_path_factory.mktemp("registry")).start()
    yield started
    started.stop()


def register(registry: RegistryProcess, subject: str, schema: str, level: str | None = None) -> int:
    client = SchemaRegistryClient({"url": registry.url})
    if level:
        client.set_compatibility(subject, level)
    return client.register_schema(subject, Schema(schema, "AVRO"))


def test_a_subjects_latest_version_declares_every_avro_type_as_its_column(registry):
    """record -> struct, a union with null -> optional, a field with a default ->
    optional (a version may add it), logical types -> timestamp, date, decimal."""
    schema = json.dumps({"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "qty", "type": "int", "default": 1},
        {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "ship", "type": {"type": "record", "name": "Ship", "fields": [
            {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "string"]}]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "double"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}}]})
    schema_id = register(registry, "orders-value", schema)

    found = latest_version(RegistryAccess(registry.url), "orders-value")

    assert (found.subject, found.version, found.schema_id, found.schema_type) == ("orders-value", 1, schema_id, "AVRO")
    assert found.value_schema.to_ddl() == (
        "`id` bigint NOT NULL, `note` string, `qty` int, `at_ms` timestamp NOT NULL, `at_us` timestamp, "
        "`day` date NOT NULL, `price` decimal(12,2) NOT NULL, "
        "`ship` struct<`city`: string NOT NULL, `zip`: string> NOT NULL, `tags` array<string> NOT NULL, "
        "`attrs` map<string, double> NOT NULL, `kind` string NOT NULL")


def test_a_subject_the_registry_cannot_give_is_refused_with_the_reason(registry):
    register(registry, "scalar-value", json.dumps("string"))
    with pytest.raises(SchemaError,
                       match=r"no latest version of subject 'nobody-value': HTTP 404: error 40401: Subject 'nobody-value' not"):
        latest_version(RegistryAccess(registry.url), "nobody-value")
    with pytest.raises(SchemaError, match="is not a record; a table's columns are a record's fields"):
        latest_version(RegistryAccess(registry.url), "scalar-value")
    register(registry, "two-types-value", s.record({"name": "x", "type": ["null", "int", "string"]}))
    with pytest.raises(SchemaError, match=r"x: union \['null', 'int', 'string'\] must be \[\"null\", T\]"):
        latest_version(RegistryAccess(registry.url), "two-types-value")
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RegistryUnavailable, match=f"schema registry {dead} is unreachable"):
        latest_version(RegistryAccess(dead), "nobody-value")
    # a list of registries (as confluent_kafka takes one): the first that answers
    register(registry, "good-value", s.V1)
    found = latest_version(RegistryAccess(f"{dead},{registry.url}"), "good-value")
    assert found.value_schema.to_ddl() == "`a` int NOT NULL"


def test_the_load_takes_its_schema_or_its_subject_not_both():
    with pytest.raises(ValueError, match="give the load's schema or its schema_subject, not both"):
        LogbusSparkLoadOperator(task_id="load", table="t", schema="a int", schema_subject="t-value")
    assert "schema_subject" in LogbusSparkLoadOperator.template_fields


def test_a_version_that_widens_a_field_or_gives_it_a_default_changes_its_column(registry, tmp_path):
    """Avro lets a version promote int to long and give a field a default; the load's
    files then hold an optional bigint, which the table's required int column would not
    take at the commit: the load's evolution widens and relaxes the column first."""
    target = IcebergTarget("widening", warehouse=str(tmp_path / "wh"))
    try:
        register(registry, "widening-value", s.V1)
        target.ensure_schema(latest_version(RegistryAccess(registry.url), "widening-value").value_schema.to_arrow())
        register(registry, "widening-value", s.record(A_LONG))
        latest = latest_version(RegistryAccess(registry.url), "widening-value").value_schema.to_arrow()
        assert target.check_schema(latest) == ["a"]
        target.ensure_schema(latest)
        a = target.catalog.load_table(target.identifier).schema().find_field("a")
        assert (str(a.field_type), a.required) == ("long", False)
        assert target.check_schema(latest) == []
    finally:
        target.close()


class InProcessLoad(LogbusSparkLoadOperator):
    """The load operator whose Spark job runs on the tests' SparkSession instead of
    through spark-submit (a JVM start per load is minutes on a loaded CI machine): the
    job gets the arguments the operator would give spark-submit, the subject's
    schema among them."""

    spark = None

    def run_spark(self, plan, staging, layout, storage) -> None:
        args = arguments().parse_args(self.application_args(plan.ranges, staging, layout))
        run_load(self.spark, ranges_from_json(args.ranges), args.staging, args.zookeeper, args.brokers, args.format,
                 args.schema, layout=args.layout, registry_url=args.registry_url)


class HourlyLoad:
    """The hourly DAG's snapshot, load and commit tasks of one interval, run in this
    process, into the Iceberg table `events`."""

    def __init__(self, spark, warehouse, registry_url: str) -> None:
        self.warehouse, self.registry_url = str(warehouse), registry_url
        InProcessLoad.spark = spark

    def run(self, end: datetime) -> dict:
        context = {"data_interval_start": end - timedelta(hours=1), "data_interval_end": end,
                   "run_id": f"scheduled__{end:%Y%m%dT%H}"}
        common = {"table": TABLE, "warehouse": self.warehouse, "target": "iceberg"}
        plan = LogbusOffsetSnapshotOperator(task_id="snapshot", topic=TOPIC, **common).execute(context)
        context["ti"] = FakeTaskInstance({"snapshot": plan})
        loaded = InProcessLoad(task_id="load", value_format="confluent", schema_subject=SUBJECT,
                               registry_url=self.registry_url, **common).execute(context)
        context["ti"] = FakeTaskInstance({"snapshot": plan, "load": loaded})
        return LogbusCommitOperator(task_id="commit", **common).execute(context)


def check(warehouse, registry_url: str) -> dict:
    return LogbusSchemaCheckOperator(task_id="check_schema", table=TABLE, schema_subject=SUBJECT,
                                     registry_url=registry_url, target="iceberg",
                                     warehouse=str(warehouse)).execute({})


def produce(zookeeper: str, values: list[bytes], first_ts: int, total: int) -> dict:
    """Send `values` a minute apart over both partitions; wait until the topic holds
    `total` messages: {(partition, offset): value}."""
    with Producer(zookeeper=zookeeper, acks=1, monitoring=False) as producer:
        for i, value in enumerate(values):
            producer.send(TOPIC, value, timestamp=first_ts + i * 60_000, partition=i % 2)
    return wait_until(lambda: _visible(zookeeper, TOPIC, total), 30, f"{total} messages in {TOPIC}")


def table_rows(target: IcebergTarget) -> list[tuple]:
    table = target.catalog.load_table(target.identifier).scan().to_arrow()
    return sorted(zip(table["partition"].to_pylist(), table["offset"].to_pylist(), table["a"].to_pylist(),
                      table["b"].to_pylist() if "b" in table.column_names else [None] * table.num_rows))


@pytest.mark.long  # four loads on the shared SparkSession (1-2 min idle); the check's rules are unit-tested here
@pytest.mark.timeout(900)  # four loads on the shared SparkSession; minutes on a loaded machine
def test_a_field_a_new_version_adds_mid_day_becomes_a_column_at_the_next_load(spark, module_cluster, registry,
                                                                            airflow_db, tmp_path):
    """Hour 1 loads values of v1 (a); then v2 (a, optional b) is registered and its
    values produced; the check sees b coming, hour 2's load adds the column: old rows
    null, new rows filled, every message once. A version widening a (int -> long, with a
    default) widens the column; one that changes a's type to string, or adds a required
    field, then fails the check and the load before Spark, naming them."""
    zk = module_cluster.zookeeper
    use_logbus_connection(zk)
    client = SchemaRegistryClient({"url": registry.url})
    context = SerializationContext(TOPIC, MessageField.VALUE)
    day = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    hour = int(day.timestamp() * 1000) + 10 * 3_600_000
    v1 = AvroSerializer(client, s.V1)
    first = produce(zk, [v1({"a": i}, context) for i in range(4)], hour, total=4)
    load = HourlyLoad(spark, tmp_path / "wh", registry.url)
    target = IcebergTarget(TABLE, warehouse=str(tmp_path / "wh"))

    assert check(tmp_path / "wh", registry.url)["columns_to_add"] == []  # no table yet: any subject fits
    assert load.run(day + timedelta(hours=11))["row_count"] == 4
    assert "b" not in target.catalog.load_table(target.identifier).schema().column_names

    v2 = AvroSerializer(client, s.ADD_OPTIONAL)  # registers version 2 with its first value
    new_values = [v2({"a": 10 + i, "b": f"x{i}"}, context) for i in range(3)] + [v1({"a": 20}, context)]
    both = produce(zk, new_values, hour + 3_600_000, total=8)
    assert check(tmp_path / "wh", registry.url) == {"subject": SUBJECT, "version": 2,
                                                    "schema_id": client.get_latest_version(SUBJECT).schema_id,
                                                    "columns_to_add": ["b"]}
    committed = load.run(day + timedelta(hours=12))

    assert (committed["row_count"], committed["rejected_count"]) == (4, 0)
    b = target.catalog.load_table(target.identifier).schema().find_field("b")
    assert (str(b.field_type), b.required) == ("string", False)
    rows = table_rows(target)
    assert sorted((p, o) for p, o, _, _ in rows) == sorted(both)  # every message, once
    assert sorted((a, b) for _, _, a, b in rows) == [(0, None), (1, None), (2, None), (3, None),
                                                     (10, "x0"), (11, "x1"), (12, "x2"), (20, None)]

    # v3 promotes a to long and gives it a default (BACKWARD, as Avro allows): the column
    # widens and becomes optional, or the load's files (bigint, nullable) would not fit it
    v3 = AvroSerializer(client, s.record(A_LONG, OPTIONAL_B))
    produce(zk, [v3({"a": 2 ** 40, "b": "big"}, context)], hour + 2 * 3_600_000, total=9)
    assert check(tmp_path / "wh", registry.url)["columns_to_add"] == ["a"]
    assert load.run(day + timedelta(hours=13))["row_count"] == 1
    a = target.catalog.load_table(target.identifier).schema().find_field("a")
    assert (str(a.field_type), a.required) == ("long", False)
    assert sorted(a for _, _, a, _ in table_rows(target)) == [0, 1, 2, 3, 10, 11, 12, 20, 2 ** 40]

    register(registry, SUBJECT, s.record({"name": "a", "type": ["null", "string"], "default": None}, OPTIONAL_B),
             level="NONE")
    with pytest.raises(LogbusSchemaIncompatibleError,
                       match=r"subject 'events-value' version 4 \(schema id \d+\) is incompatible with table "
                             r"'events': field 'a' changes type from bigint to string: not a widening"):
        check(tmp_path / "wh", registry.url)
    register(registry, SUBJECT, s.record(A_LONG, OPTIONAL_B, {"name": "c", "type": "long"}))
    with pytest.raises(LogbusSchemaIncompatibleError, match=r"version 5 .* field 'c' \(bigint NOT NULL\) is added "
                                                            "as required"):
        check(tmp_path / "wh", registry.url)
    with pytest.raises(SchemaError, match=r"field 'c' \(bigint NOT NULL\) is added as required"):
        load.run(day + timedelta(hours=14))  # the load refuses it too, before Spark
    assert len(table_rows(target)) == 9


def test_a_directory_table_is_checked_against_the_schema_its_latest_batch_declared(registry, tmp_path):
    """A directory table's files carry their own schema: the check compares with the
    declaration its latest batch recorded (an inferred one is no declaration)."""
    from airflow_provider_logbus.targets.base import BatchRecord
    from airflow_provider_logbus.targets.directory import BATCH_RECORD, DirectoryTarget

    target = DirectoryTarget(tmp_path, "dir_events")
    for batch_id, committed_at, schema, source in (("b1", "2026-01-01T10:00:00", "`a` string", "declared"),
                                                   ("b2", "2026-01-01T11:00:00", "`a` int NOT NULL", "declared"),
                                                   ("b3", "2026-01-01T12:00:00", "`z` string", "inferred")):
        record = BatchRecord("dir_events", batch_id, "", committed_at, "run", [], [], 0, committed_at=committed_at,
                             schema=schema, schema_source=source)
        target.batch_dir(batch_id).mkdir(parents=True)
        (target.batch_dir(batch_id) / BATCH_RECORD).write_text(json.dumps(record.to_dict()))
    register(registry, "dir-value", s.ADD_OPTIONAL)
    checked = LogbusSchemaCheckOperator(task_id="check_schema", table="dir_events", schema_subject="dir-value",
                                        registry_url=registry.url, warehouse=str(tmp_path)).execute({})
    assert checked["columns_to_add"] == ["b"]
    register(registry, "dir-value", s.A_AS_STRING, level="NONE")
    with pytest.raises(LogbusSchemaIncompatibleError, match="table 'dir_events': field 'a' changes type from int to "
                                                            "string"):
        LogbusSchemaCheckOperator(task_id="check_schema", table="dir_events", schema_subject="dir-value",
                                  registry_url=registry.url, warehouse=str(tmp_path)).execute({})
