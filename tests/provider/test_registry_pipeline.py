"""Registry-framed Avro from producer to table (issue 37): values framed by
confluent_kafka's AvroSerializer against a real `logbus schema-registry`, produced both
through a broker's Kafka listener (librdkafka) and through the native logbus producer
(the framed bytes as they are), loaded by the example hourly DAG (`dag.test()`, the
schema check before the load, Spark through spark-submit) into an Iceberg table whose
schema is the subject's latest version. Hour 1 holds values of version 1 and two that do
not decode (an id the registry never gave, a body cut short): every field lands in its
column, the two in the rejects with their reasons, counted. Version 2 then adds an
optional field mid-day: hour 2's run adds its column (older rows null there, newer rows
filled). Every event once, both hours audited complete against the brokers' counts
(loaded + rejected = produced)."""

from __future__ import annotations

import json
import os
import struct
import time

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.targets.iceberg import IcebergTarget
from broker.client.producer import Producer
from harness.cluster import LocalCluster
from harness.process import wait_until
from harness.registry import RegistryProcess
from tests.kafka.clients import producer as kafka_producer

from .conftest import load_dag, new_chroot, use_logbus_connection
from .helpers import HOUR_MS, yesterday_start
from .test_iceberg_dag import utc

pytestmark = [pytest.mark.slow, pytest.mark.long]
TOPIC = TABLE = "registry_pipeline"
SUBJECT = f"{TOPIC}-value"
V1_FIELDS = [{"name": "n", "type": "long"}, {"name": "server", "type": "string"},
             {"name": "ts_ms", "type": "long"}, {"name": "latency_ms", "type": "double"},
             {"name": "ok", "type": "boolean"}, {"name": "page", "type": ["null", "string"], "default": None}]
REFERRER = {"name": "referrer", "type": ["null", "string"], "default": None}  # version 2 adds it


def avro_schema(*fields: dict) -> str:
    return json.dumps({"type": "record", "name": "Visit", "namespace": "logbus.tests", "fields": list(fields)})


def event(n: int, ts: int, version: int) -> dict:
    record = {"n": n, "server": f"web-{n % 3}", "ts_ms": ts, "latency_ms": n / 4, "ok": n % 3 != 0,
              "page": None if n % 5 == 0 else f"/p/{n}"}
    return {**record, "referrer": f"r{n}"} if version == 2 else record


class Producers:
    """One framed value at a time through the Kafka listener or the native producer,
    chosen per value; partition and record time given. Both flushed, every send
    acknowledged, by `close()`."""

    def __init__(self, bootstrap: str, zookeeper: str) -> None:
        self.kafka = kafka_producer(bootstrap, **{"linger.ms": 20})
        self.native = Producer(zookeeper=zookeeper, acks=1, monitoring=False)
        self.kafka_failed: list = []

    def send(self, value: bytes, ts: int, partition: int, through_kafka: bool) -> None:
        if through_kafka:
            self.kafka.produce(TOPIC, value, partition=partition, timestamp=ts,
                               on_delivery=lambda err, _msg: err is None or self.kafka_failed.append(err))
            self.kafka.poll(0)
        else:
            self.native.send(TOPIC, value, timestamp=ts, partition=partition)

    def close(self) -> None:
        assert self.kafka.flush(60) == 0 and not self.kafka_failed, self.kafka_failed
        report = self.native.close()
        assert not report.failed, report.failed


def send_events(producers: Producers, serialize, events: list[tuple[int, int]], version: int) -> None:
    """Each (n, record time) framed by `serialize`, on partition n % 2; n % 4 < 2
    through the Kafka listener, the others through the native producer."""
    context = SerializationContext(TOPIC, MessageField.VALUE)
    for n, ts in events:
        producers.send(serialize(event(n, ts, version), context), ts, n % 2, through_kafka=n % 4 < 2)


def wait_past(connect: str, end: int) -> None:
    """Until every partition holds data stamped after `end` (what the DAG's sensor waits for)."""
    with LogbusCluster(connect) as c:
        wait_until(lambda: all(c.has_data_after(TOPIC, p, end) for p in (0, 1)), 30, "data past the end")


def scan(target: IcebergTarget, identifier: str) -> list[dict]:
    return target.catalog.load_table(identifier).scan().to_arrow().to_pylist()


def test_avro_framed_by_the_serializer_loads_hourly_into_columns_evolving_mid_day_with_rejects_audited(
        zookeeper, tmp_path, airflow_db, monkeypatch):
    connect = new_chroot(zookeeper)
    h1 = int(yesterday_start().timestamp() * 1000) + 10 * HOUR_MS
    ends = [h1 + HOUR_MS, h1 + 2 * HOUR_MS]
    hour_1 = [(n, h1 + n * 120_000) for n in range(20)]  # v1, 10:00 to 10:38
    lead_in = [(100 + i, ends[0] + i * 60_000) for i in range(4)]  # v1, 11:00-11:03: the sensor's data past the end
    hour_2 = [(200 + i, ends[0] + 600_000 + i * 120_000) for i in range(12)]  # v2, 11:10 to 11:32
    now = int(time.time() * 1000)
    tail = [(300 + i, now + i) for i in range(4)]  # v2, today: past hour 2, in no audited hour
    warehouse = tmp_path / "warehouse"
    env = {"LOGBUS_TOPIC": TOPIC, "LOGBUS_TABLE": TABLE, "LOGBUS_WAREHOUSE": str(warehouse),
           "LOGBUS_GROUP": "loader", "LOGBUS_SENSOR_GRACE_MINUTES": "0", "LOGBUS_AUDIT_GRACE_MINUTES": "0",
           "LOGBUS_RETRY_DELAY_SECONDS": "0", "LOGBUS_TARGET": "iceberg", "LOGBUS_VALUE_FORMAT": "confluent",
           "LOGBUS_SCHEMA_SUBJECT": SUBJECT}
    for name in [n for n in os.environ if n.startswith("LOGBUS_")]:
        monkeypatch.delenv(name)  # no setting another test parsed with; all restored after this one
    settings = {"log.flush.interval.ms": 20, "num.partitions": 2, "audit.count.interval.ms": 100}
    with LocalCluster(connect, tmp_path / "brokers", settings=settings) as cluster:
        broker = cluster.start_broker(0, kafka=True)
        registry = RegistryProcess(connect, tmp_path).start()
        try:
            client = SchemaRegistryClient({"url": registry.url})
            v1 = AvroSerializer(client, avro_schema(*V1_FIELDS))  # registers version 1 with its first value
            use_logbus_connection(connect)
            for name, value in {**env, "LOGBUS_REGISTRY_URL": registry.url}.items():
                monkeypatch.setenv(name, value)
            dag = load_dag("logbus_hourly_load.py", {})

            producers = Producers(broker.kafka_bootstrap, connect)
            send_events(producers, v1, hour_1, 1)
            framed = v1(event(50, h1 + 50 * 60_000, 1), SerializationContext(TOPIC, MessageField.VALUE))
            unknown_id = framed[:1] + struct.pack(">I", 99_999) + framed[5:]
            producers.send(unknown_id, h1 + 50 * 60_000, 0, through_kafka=True)
            producers.send(framed[:-3], h1 + 51 * 60_000, 1, through_kafka=False)  # a body cut short
            send_events(producers, v1, lead_in, 1)
            producers.close()
            wait_past(connect, ends[0])
            first = dag.test(logical_date=utc(ends[0]))

            v2 = AvroSerializer(client, avro_schema(*V1_FIELDS, REFERRER))  # registers version 2 mid-day
            producers = Producers(broker.kafka_bootstrap, connect)
            send_events(producers, v2, hour_2 + tail, 2)
            producers.close()
            assert client.get_latest_version(SUBJECT).version == 2
            wait_past(connect, ends[1])
            second = dag.test(logical_date=utc(ends[1]))
        finally:
            registry.stop()
        target = IcebergTarget(TABLE, warehouse=str(warehouse))
        try:
            rows, rejects = scan(target, target.identifier), scan(target, target.rejects_identifier)
            columns = target.table_or_fail().schema().column_names
            batches = target.batches()
        finally:
            target.close()
    assert [str(r.state) for r in (first, second)] == ["success"] * 2, [
        r.get_task_instances() for r in (first, second)]
    assert "check_schema" in dag.get_task("load").get_flat_relative_ids(upstream=True)  # fails before Spark
    checked = [r.get_task_instance("check_schema").xcom_pull(task_ids="check_schema") for r in (first, second)]
    assert [(c["subject"], c["version"], c["columns_to_add"]) for c in checked] == [
        (SUBJECT, 1, []), (SUBJECT, 2, ["referrer"])]  # no table yet; then the field version 2 adds

    assert "referrer" in columns
    versions = {n: 1 for n, _ in hour_1 + lead_in} | {n: 2 for n, _ in hour_2 + tail}
    sent = dict(hour_1 + lead_in + hour_2 + tail)
    assert len(rows) == len(sent) and {r["n"] for r in rows} == set(sent)  # every event, once
    assert len({(r["topic"], r["partition"], r["offset"]) for r in rows}) == len(rows)
    for row in rows:  # every field in its column; the older versions' rows null in the new one
        expected = {"referrer": None, **event(row["n"], sent[row["n"]], versions[row["n"]])}
        assert {k: row[k] for k in expected} == expected, row
        assert row["partition"] == row["n"] % 2
        assert int(row["timestamp"].timestamp() * 1000) == row["ts_ms"]  # record time = event time

    errors = sorted((r["partition"], r["value"], r["error"]) for r in rejects)
    assert [(p, v) for p, v, _ in errors] == [(0, unknown_id), (1, framed[:-3])]
    assert "schema id 99999 is not in the registry" in errors[0][2], errors
    assert "does not decode with schema id" in errors[1][2], errors
    assert [(b.row_count, b.rejected_count) for b in batches] == [(24, 2), (16, 0)]

    reports = [json.loads(p.read_text()) for p in sorted((warehouse / "_audit").rglob("*.json"))]
    assert [r["end_ms"] for r in reports] == ends
    for report, (loaded, rejected) in zip(reports, [(20, 2), (16, 0)]):
        assert report["status"] == "ok" and report["tiers"] == ["broker", "table"], report
        assert (report["loaded"], report["rejected"]) == (loaded, rejected), report
        assert report["produced"] == report["counted"] == loaded + rejected, report
        assert report["missing"] == report["duplicated"] == report["unreported"] == 0, report
