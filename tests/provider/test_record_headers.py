"""Kafka record headers are a column of every table the load writes (docs/provider.md,
"Record headers"): records produced by librdkafka through a real broker's Kafka
listener, beside native messages, loaded by the real Spark load (local mode) into an
Iceberg table, its rejects table, and a raw directory layout — each row's `headers`
exactly the record's, an empty list for a message without any. A JSON field named `headers`
becomes `value_headers`, as any field named like a logbus column."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from broker.client.producer import Producer as NativeProducer
from harness.cluster import LocalCluster
from harness.process import wait_until
from tests.kafka.clients import producer, produce_all

from airflow_provider_logbus.batch import commit_batch, plan_batch
from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.plan import Range
from airflow_provider_logbus.schema import SchemaError
from airflow_provider_logbus.spark.load_job import run_load
from airflow_provider_logbus.targets.iceberg import IcebergTarget
from airflow_provider_logbus.targets.iceberg_tables import embedded_catalog

from .conftest import new_chroot
from .helpers import all_messages

pytestmark = pytest.mark.slow

TOPIC = "kafka_events"
HOUR = datetime(2024, 5, 1, 9, tzinfo=timezone.utc)
HOUR_MS = int(HOUR.timestamp() * 1000)
SCHEMA = "server string, n long NOT NULL, headers string"
VALUE = pa.schema([pa.field("server", pa.string()), pa.field("n", pa.int64(), nullable=False),
                   pa.field("headers", pa.string())])


def kafka_headers(i: int) -> list:
    """None, one, a null value and an empty one, binary, a key twice: by `i % 5`."""
    return [[], [("trace", f"t-{i}".encode())], [("trace", b"x"), ("null", None), ("empty", b"")],
            [("bin", bytes([0, 255, i % 256]))], [("dup", b"1"), ("dup", b"2")]][i % 5]


def kafka_records() -> list[tuple[bytes | None, bytes, list]]:
    """60 records; every tenth is not JSON (a reject), whose headers must be kept too."""
    return [(f"k{i}".encode(), b"not json" if i % 10 == 7 else
             json.dumps({"server": f"web-{i % 3}", "n": i, "headers": f"json-{i}"}).encode(), kafka_headers(i))
            for i in range(60)]


def as_column(headers: list) -> list | None:
    return [{"key": k, "value": v} for k, v in headers]


@pytest.fixture(scope="module")
def produced(zookeeper, tmp_path_factory):
    """Topic `kafka_events` (one partition): 20 native messages, then the Kafka records
    in batches (lz4), then 20 native messages, all stamped in `HOUR`. Yields the
    cluster's connect string and {offset: (value, headers)} of every message."""
    connect = new_chroot(zookeeper)
    cluster = LocalCluster(connect, tmp_path_factory.mktemp("brokers"), settings={"log.flush.interval.ms": 20})
    try:
        broker = cluster.start_broker(0, kafka=True)
        native = [json.dumps({"server": "native", "n": 1000 + i}).encode() for i in range(40)]

        def send_native(values: list[bytes], first: int) -> None:
            with NativeProducer(zookeeper=connect, acks=1, monitoring=False) as p:
                for i, value in enumerate(values):
                    p.send(TOPIC, value, timestamp=HOUR_MS + first + i, partition=0)

        send_native(native[:20], 0)
        wait_until(lambda: len(all_messages(connect, TOPIC)) == 20, 30, "the first native messages")
        records = kafka_records()
        kafka = producer(broker.kafka_bootstrap, **{"compression.type": "lz4", "linger.ms": 50})
        for i, (key, value, headers) in enumerate(records):
            kafka.produce(TOPIC, value, key, partition=0, headers=headers, timestamp=HOUR_MS + 100 + i)
        assert kafka.flush(60) == 0
        send_native(native[20:], 1000)
        wait_until(lambda: len(all_messages(connect, TOPIC)) == 100, 30, "every message")
        stored = {m.offset: (m.value, list(m.headers)) for _, m in all_messages(connect, TOPIC)}
        assert sorted(v for v, _ in stored.values()) == sorted([*native, *(v for _, v, _ in records)])
        yield connect, stored
    finally:
        cluster.stop()


def test_kafka_record_headers_load_into_the_iceberg_table_and_its_rejects(spark, produced, tmp_path):
    connect, stored = produced
    target = IcebergTarget(TOPIC, warehouse=str(tmp_path / "wh"))
    try:
        target.ensure_schema(VALUE)
        with LogbusCluster(connect) as client:
            plan = plan_batch(client, target, TOPIC, HOUR, HOUR + timedelta(hours=1))
            staging = target.prepare_staging(plan.batch_id, 1)
            run_load(spark, plan.ranges, staging, zookeeper=connect, value_format="json", schema=SCHEMA,
                     layout="iceberg")
            record = commit_batch(target, plan, staging, "headers").record
        rows = target.table_or_fail().scan(selected_fields=("offset", "headers", "value_headers", "n")).to_arrow()
        rejects = target.tables.load(target.rejects_identifier).scan(
            selected_fields=("offset", "headers", "value")).to_arrow()
    finally:
        target.close()
    bad = {o for o, (v, _) in stored.items() if v == b"not json"}
    assert record.row_count == 100 - len(bad) and record.rejected_count == len(bad) == 6
    header = rows.schema.field("headers").type.value_type  # array<struct<key: string, value: binary>>
    assert [f.name for f in header] == ["key", "value"]
    assert str(header.field("key").type) in ("string", "large_string")
    assert str(header.field("value").type) in ("binary", "large_binary")
    loaded = {o: h for o, h in zip(rows["offset"].to_pylist(), rows["headers"].to_pylist())}
    assert loaded == {o: as_column(h) for o, (v, h) in stored.items() if o not in bad}
    assert sum(h != [] for h in loaded.values()) == 48 - 6  # 4 in 5 Kafka records, less the rejects; no native one
    by_n = dict(zip(rows["n"].to_pylist(), rows["value_headers"].to_pylist()))
    assert by_n[1] == "json-1" and by_n[1000] is None  # the JSON field, beside the record's headers
    assert {o: h for o, h in zip(rejects["offset"].to_pylist(), rejects["headers"].to_pylist())} == {
        o: as_column(stored[o][1]) for o in bad}


def test_a_raw_load_into_the_directory_layout_keeps_the_headers(spark, produced, tmp_path):
    connect, stored = produced
    with LogbusCluster(connect) as client:
        ranges = [Range(TOPIC, p, o.earliest, o.latest) for p, o in client.partition_offsets(TOPIC).items()]
    run_load(spark, ranges, str(tmp_path / "s"), zookeeper=connect, value_format="raw")
    table = ds.dataset(str(tmp_path / "s"), format="parquet", partitioning="hive").to_table(
        columns=["offset", "headers", "value"])
    assert {o: (v, h) for o, h, v in zip(*(table[c].to_pylist() for c in ("offset", "headers", "value")))} == {
        o: (v, as_column(h)) for o, (v, h) in stored.items()}


def test_a_tables_json_headers_column_must_be_renamed_before_record_headers_load(tmp_path):
    """A table written before this change whose `headers` column holds a JSON field: the
    load refuses to write record headers over it, naming the rename that keeps its rows."""
    JSON_HEADERS = pa.schema([pa.field("headers", pa.string())])
    catalog = embedded_catalog(str(tmp_path / "wh"))
    old = IcebergTarget("old", catalog_properties=catalog, warehouse=str(tmp_path / "wh"))
    try:
        old.tables.catalog.create_namespace_if_not_exists("logbus")
        old.tables.catalog.create_table(old.tables.identifier, schema=pa.schema(
            [pa.field("topic", pa.string()), pa.field("offset", pa.int64()), pa.field("headers", pa.string())]))
        with pytest.raises(SchemaError, match="RENAME COLUMN headers TO value_headers"):
            old.ensure_schema(JSON_HEADERS)
        with old.table_or_fail().update_schema() as update:
            update.rename_column("headers", "value_headers")
        old.ensure_schema(JSON_HEADERS)
        fields = {f.name: f for f in old.table_or_fail().schema().fields}
        assert str(fields["value_headers"].field_type) == "string"
        assert str(fields["headers"].field_type).startswith("list<struct<")
    finally:
        old.close()
