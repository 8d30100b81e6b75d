"""The upgrade to per-record offsets (docs/architecture.md, "Offsets"): a broker data
directory and an Iceberg table written by the code before it — the messages of a
producer batch or compressed set loaded at their entry's offset — are read, loaded on
and audited by today's code, with no message lost or loaded twice. The fixture and how
to regenerate it: tests/provider/fixtures/pre_record_offsets.py."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from airflow_provider_logbus.batch import audit_inputs, await_broker_counts, commit_batch, plan_batch
from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.completeness import judge
from airflow_provider_logbus.schema import load_schema
from airflow_provider_logbus.spark.load_job import run_load
from airflow_provider_logbus.targets.iceberg import IcebergTarget
from harness.cluster import LocalCluster
from harness.process import wait_until

from .conftest import new_chroot
from .fixtures.pre_record_offsets import (DAY, LOADED, SCHEMA, TOPIC, UNLOADED, hour_ms, produce, restore_zookeeper,
                                          unpack)
from .helpers import all_messages

LATER = 40  # messages produced after the upgrade, in 12:00


def load(client: LogbusCluster, target: IcebergTarget, spark, zookeeper: str, start: int, end: int) -> dict:
    """The DAG's batch of hours [start, end) of `DAY`: snapshot, the table's schema (as
    the load task ensures it before Spark starts), load job, commit."""
    target.ensure_schema(load_schema(SCHEMA).to_arrow())
    plan = plan_batch(client, target, TOPIC, DAY + timedelta(hours=start), DAY + timedelta(hours=end))
    staging = target.prepare_staging(plan.batch_id, 1)
    run_load(spark, plan.ranges, staging, zookeeper=zookeeper, value_format="json", schema=SCHEMA, layout="iceberg")
    return commit_batch(target, plan, staging, "after-upgrade", cluster=client, group="loader").record.to_dict()


def table_rows(target: IcebergTarget) -> list[tuple[int, int, int]]:
    """(partition, offset, n) of every row."""
    table = target.table_or_fail().scan(selected_fields=("partition", "offset", "n")).to_arrow()
    return sorted(zip(*(table[c].to_pylist() for c in ("partition", "offset", "n"))))


@pytest.mark.slow
def test_a_table_loaded_before_record_offsets_loads_on_and_audits_after_the_upgrade(zookeeper, spark, tmp_path):
    """The old broker's data directory (100 messages in batches and compressed sets, the
    first 60 loaded by the old load job: 60 rows on 11 offsets) under a broker of today,
    40 more produced now, and the next load: the 40 old messages the old code left and
    the 40 new ones. Every
    message is in the table once; the old rows keep their offsets, the new ones have the
    offsets a consumer reads them at, unique; the audit finds nothing missing, nothing
    duplicated and no hole or overlap between the old batch and the new ones. The table
    (and its rejects table), written without a `headers` column, gains it."""
    fixture = unpack(tmp_path)
    connect = new_chroot(zookeeper)
    restore_zookeeper(connect, fixture["zookeeper"])
    cluster = LocalCluster(connect, tmp_path, settings={"log.flush.interval.ms": 20})
    target = IcebergTarget(TOPIC, warehouse=fixture["warehouse"])
    old_rows = [tuple(r) for r in fixture["rows"]]
    total = LOADED + UNLOADED + LATER
    try:
        assert table_rows(target) == old_rows  # the table as the old code left it, relocated
        cluster.start_broker(0)
        with LogbusCluster(connect) as client:
            stored = all_messages(connect, TOPIC)
            assert len(stored) == LOADED + UNLOADED == len({(p, m.offset) for p, m in stored})
            produce(connect, LOADED + UNLOADED, LATER, hour_ms(12))
            wait_until(lambda: len(all_messages(connect, TOPIC)) == total, 30, "the messages produced now")
            wait_until(lambda: audit_inputs(client, target).report(TOPIC, TOPIC, hour_ms(10), hour_ms(13), 0.999)[
                "produced"] == total, 30, "the producers' monitoring events")
            record = load(client, target, spark, connect, 11, 13)
            native = sorted((p, m.offset, json.loads(m.value)["n"]) for p, m in all_messages(connect, TOPIC))
            # the broker of today counts the old log from its start, as the new records
            wait_until(lambda: TOPIC in client.broker_counts().topics(), 30, "the brokers' record counts")
            inputs = await_broker_counts(client, audit_inputs(client, target), TOPIC, 60)
            report = judge(inputs.report(TOPIC, TOPIC, hour_ms(10), hour_ms(13), 0.999), now_ms=hour_ms(14), grace_ms=0)
    finally:
        cluster.stop()
        target.close()
    rows = table_rows(target)
    headers = target.table_or_fail().scan(selected_fields=("n", "headers")).to_arrow()
    by_n = dict(zip(headers["n"].to_pylist(), headers["headers"].to_pylist()))
    rejects = target.tables.load(target.rejects_identifier).schema()
    assert record["row_count"] == UNLOADED + LATER
    # the table gained the record headers column (issue 36): null in the old rows, empty in
    # the new ones (native messages have none); the rejects table gained it too
    assert [by_n[n] for n in range(total)] == [None] * LOADED + [[]] * (UNLOADED + LATER)
    assert "headers" in {f.name for f in rejects.fields}
    assert sorted(n for _, _, n in rows) == list(range(total))  # every message once
    assert [r for r in rows if r[2] < LOADED] == old_rows  # loaded before: offsets kept, shared
    assert len({r[:2] for r in old_rows}) < LOADED
    new_rows = [r for r in rows if r[2] >= LOADED]
    assert new_rows == [r for r in native if r[2] >= LOADED]  # each at the offset a consumer reads it at
    assert len({r[:2] for r in new_rows}) == len(new_rows) == UNLOADED + LATER
    assert len({r[:2] for r in native}) == total
    assert (report["status"], report["produced"], report["loaded"], report["missing"], report["duplicated"],
            report["offset_gaps"]) == ("ok", total, total, 0, 0, []), report["reasons"]
    # the hours are older than audit.window.retention.ms: the brokers' counts of them are
    # partial (pruned), shown and not compared — audited producer -> table, as before
    assert report["tiers"] == ["producer", "broker", "table"]
    assert all(t.get("partial") for h in report["hours"] for t in h["tiers"] if t["tier"] == "broker")
