"""The pipeline from a Kafka client to the table (issue 36): events librdkafka produced
(idempotent, acks=all, zstd) through a broker's Kafka listener, each record stamped with
its event time in one of two of yesterday's hours and carrying headers, loaded by the
example hourly DAG (`dag.test()`, Spark through spark-submit) into an Iceberg table:
every event once, each row with its record's headers, both hours audited complete
against the brokers' counts (the broker tier: a Kafka client publishes no monitoring
events), and the second hour's run again (a retry or backfill) loading nothing twice."""

from __future__ import annotations

import json
import time

import pytest

from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.targets.iceberg import IcebergTarget
from harness.cluster import LocalCluster
from harness.process import wait_until
from tests.kafka.clients import producer

from .conftest import load_dag, new_chroot, use_logbus_connection
from .helpers import HOUR_MS, yesterday_start
from .test_iceberg_dag import utc
from .test_record_headers import as_column, kafka_headers

pytestmark = [pytest.mark.slow, pytest.mark.long]
TOPIC = TABLE = "kafka_pipeline"
PER_HOUR = 60


def send_events(bootstrap: str, events: list[tuple[int, int]]) -> None:
    """Each (n, event time) as a JSON event over 2 partitions, the record stamped with
    its event time and carrying `kafka_headers(n)`; every one acknowledged."""
    p = producer(bootstrap, **{"compression.type": "zstd", "linger.ms": 20})
    failed = []
    for n, ts in events:
        value = json.dumps({"server": f"web-{n % 3}", "n": n, "ts_ms": ts}).encode()
        p.produce(TOPIC, value, f"k{n}".encode(), partition=n % 2, timestamp=ts, headers=kafka_headers(n),
                  on_delivery=lambda err, _msg: err is None or failed.append(err))
        p.poll(0)
    assert p.flush(60) == 0 and not failed, failed


def table_rows(target: IcebergTarget) -> list[dict]:
    fields = ("topic", "partition", "offset", "n", "timestamp", "ts_ms", "headers")
    return target.table_or_fail().scan(selected_fields=fields).to_arrow().to_pylist()


def test_librdkafka_events_load_hourly_into_iceberg_exactly_once_with_headers_and_audited_complete(
        zookeeper, tmp_path, airflow_db):
    connect = new_chroot(zookeeper)
    h0 = int(yesterday_start().timestamp() * 1000) + 10 * HOUR_MS
    ends = [h0 + HOUR_MS, h0 + 2 * HOUR_MS]
    events = [(n, h0 + n * 60_000) for n in range(2 * PER_HOUR)]  # one a minute, 10:00 to 11:59
    now = int(time.time() * 1000)
    tail = [(1000 + i, now + i) for i in range(4)]  # today: past the second interval, in no audited hour
    warehouse = tmp_path / "warehouse"
    env = {"LOGBUS_TOPIC": TOPIC, "LOGBUS_TABLE": TABLE, "LOGBUS_WAREHOUSE": str(warehouse),
           "LOGBUS_GROUP": "loader", "LOGBUS_SENSOR_GRACE_MINUTES": "0", "LOGBUS_AUDIT_GRACE_MINUTES": "0",
           "LOGBUS_RETRY_DELAY_SECONDS": "0", "LOGBUS_TARGET": "iceberg",
           "LOGBUS_VALUE_SCHEMA": "server string, n long NOT NULL, ts_ms long"}
    settings = {"log.flush.interval.ms": 20, "num.partitions": 2, "audit.count.interval.ms": 100}
    with LocalCluster(connect, tmp_path / "brokers", settings=settings) as cluster:
        broker = cluster.start_broker(0, kafka=True)
        use_logbus_connection(connect)
        dag = load_dag("logbus_hourly_load.py", env)
        runs = []
        # each run loads what its snapshot finds: the first, hour 10 and 11:00-11:03 (the
        # data past its end the sensor waits for); the second, the rest of hour 11 and the tail
        for end, sent in ((ends[0], events[:PER_HOUR + 4]), (ends[1], events[PER_HOUR + 4:] + tail)):
            send_events(broker.kafka_bootstrap, sent)
            with LogbusCluster(connect) as c:
                wait_until(lambda: all(c.has_data_after(TOPIC, p, end) for p in (0, 1)), 30, "data past the end")
            runs.append(dag.test(logical_date=utc(end)))
        target = IcebergTarget(TABLE, warehouse=str(warehouse))
        try:
            rows = table_rows(target)
            runs.append(dag.test(logical_date=utc(ends[1])))  # the second hour again: a retry, a backfill
            rows_again, batches = table_rows(target), target.batches()
            batch_snapshots = [s for s in target.table_or_fail().metadata.snapshots
                               if "logbus.batch-id" in s.summary.additional_properties]
        finally:
            target.close()
    assert [str(r.state) for r in runs] == ["success"] * 3, [r.get_task_instances() for r in runs]

    sent = dict(events + tail)
    assert len(rows) == len(sent) and {r["n"] for r in rows} == set(sent)
    assert len({(r["topic"], r["partition"], r["offset"]) for r in rows}) == len(rows)
    assert all(int(r["timestamp"].timestamp() * 1000) == r["ts_ms"] for r in rows)  # record time = event time
    assert all(r["ts_ms"] == sent[r["n"]] for r in rows)
    assert {r["n"]: r["headers"] for r in rows} == {n: as_column(kafka_headers(n)) for n in sent}

    assert sorted(rows_again, key=lambda r: r["n"]) == sorted(rows, key=lambda r: r["n"])
    assert len(batches) == len(batch_snapshots) == 2 and [b.row_count for b in batches] == [64, 60]

    reports = [json.loads(p.read_text()) for p in sorted((warehouse / "_audit").rglob("*.json"))]
    assert [r["end_ms"] for r in reports] == ends  # the re-run rewrote the second hour's report
    for report in reports:
        assert report["status"] == "ok" and report["tiers"] == ["broker", "table"], report
        assert report["produced"] == report["counted"] == report["loaded"] == PER_HOUR, report
        assert report["missing"] == report["duplicated"] == report["unreported"] == 0, report
