"""The audit (complete, cut short, under threshold) and retention data loss
(on_data_loss fail / skip), with loads run by the load job on a shared SparkSession."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest


from airflow_provider_logbus.batch import DataLossError, audit_inputs, await_broker_counts, commit_batch, plan_batch
from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.hooks.logbus import LogbusHook
from airflow_provider_logbus.spark.load_job import run_load
from airflow_provider_logbus.targets.directory import DirectoryTarget
from harness.process import wait_until

from .conftest import use_logbus_connection
from .helpers import produce, run_daily_audit, table_rows

pytestmark = pytest.mark.slow
HOUR = 3_600_000
VALUE_BYTES = 200
ENTRY = 22 + VALUE_BYTES  # keyless entries: 22 bytes of header + the value
SCHEMA = "server string, n long, ts_ms long, pad string"


def load_batch(hook: LogbusHook, spark, warehouse, table: str, topic: str, start: datetime, end: datetime,
               **snapshot_kwargs) -> dict:
    """snapshot → load job (in-process Spark) → commit, as the DAG's tasks do; the
    commit's record in its XCom form."""
    target = DirectoryTarget(warehouse, table)
    plan = plan_batch(hook.get_conn(), target, topic, start, end, **snapshot_kwargs)
    staging = target.prepare_staging(plan.batch_id, 1)
    run_load(spark, plan.ranges, str(staging), zookeeper=hook.cluster_address()["zookeeper"],
             value_format="json", schema=SCHEMA)
    return commit_batch(target, plan, str(staging), "test", cluster=hook.get_conn(), group="loader").record.to_dict()


def audit(hook: LogbusHook, warehouse, table: str, start: datetime, end: datetime) -> dict:
    """The audit report of `table` (topic of the same name) over [start, end)."""
    inputs = await_broker_counts(hook.get_conn(), audit_inputs(hook.get_conn(), DirectoryTarget(warehouse, table)),
                                 table, 60)  # as the audit task does: the leaders count every few seconds
    return inputs.report(table, table, int(start.timestamp() * 1000), int(end.timestamp() * 1000), 0.999)


def daily_audit(zk: str, warehouse, table: str, day: tuple[datetime, datetime], grace_minutes: int) -> tuple[str, dict]:
    """Run the example daily audit DAG over `day` for the directory table `table` (topic
    of the same name); (the run's state, the report it kept)."""
    use_logbus_connection(zk)
    return run_daily_audit({"LOGBUS_WAREHOUSE": str(warehouse), "LOGBUS_TABLE": table, "LOGBUS_TOPIC": table,
                            "LOGBUS_TARGET": "directory", "LOGBUS_DAILY_AUDIT_GRACE_MINUTES": str(grace_minutes),
                            "LOGBUS_AUDIT_THRESHOLD": "0.99"}, day[0])


def wait_flushed(zk: str, topic: str, count: int) -> None:
    with LogbusCluster(zk) as c:
        wait_until(lambda: sum(c.latest(topic, p) for p in c.partitions(topic)) == count * ENTRY, 30, "flush")


def produced_yesterday(cluster, yesterday, topic: str, count: int, spacing_ms: int) -> tuple[str, int]:
    """A 2-partition broker holding `count` visible messages stamped from 10:00 yesterday,
    `spacing_ms` apart. Returns (zookeeper, count)."""
    cluster.start_broker(0, {"num.partitions": 2})
    zk = cluster.zookeeper
    t0 = int(yesterday[0].timestamp() * 1000) + 10 * HOUR
    n = produce(zk, topic, [t0 + i * spacing_ms for i in range(count)], value_bytes=VALUE_BYTES, keyed=False,
                one_entry_each=True)
    wait_flushed(zk, topic, n)
    return zk, n


@pytest.fixture
def yesterday() -> tuple[datetime, datetime]:
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=1), today


def test_audit_finds_nothing_missing_when_everything_is_loaded(cluster, spark, tmp_path, yesterday):
    zk, n = produced_yesterday(cluster, yesterday, "clicks", 150, 40_000)
    start, end = yesterday
    hook = LogbusHook(zookeeper=zk)
    load_batch(hook, spark, tmp_path, "clicks", "clicks", start, end)
    report = audit(hook, tmp_path, "clicks", start, end)
    hook.close()
    assert (report["produced"], report["loaded"], report["missing"], report["duplicated"]) == (n, n, 0, 0)
    assert report["completeness"] == 1.0 and not report["offset_gaps"] and not report["data_loss"]
    by_hour = {h["hour"][-6:]: (h["produced"], h["loaded"]) for h in report["hours"] if h["produced"]}
    assert by_hour == {"10:00Z": (90, 90), "11:00Z": (60, 60)}


def test_audit_counts_exactly_what_a_cut_short_batch_missed_and_fails_the_task(
        cluster, spark, tmp_path, yesterday, airflow_db):
    zk, n = produced_yesterday(cluster, yesterday, "views", 200, 10_000)
    start, end = yesterday
    hook = LogbusHook(zookeeper=zk)
    cap = 30 * ENTRY + ENTRY // 2  # a cap between messages: 30 whole messages per partition
    with LogbusCluster(zk) as c:
        per_partition = {p: c.latest("views", p) // ENTRY for p in c.partitions("views")}
    record = load_batch(hook, spark, tmp_path, "views", "views", start, end, max_bytes_per_partition=cap)
    hook.close()
    loaded = sum(min(count, 30) for count in per_partition.values())
    assert record["row_count"] == loaded == len(table_rows(tmp_path / "views"))
    assert all(r["end"] - r["start"] == min(per_partition[r["partition"]], 30) * ENTRY for r in record["ranges"])

    state, report = daily_audit(zk, tmp_path, "views", yesterday, grace_minutes=0)
    assert state == "failed"
    assert report["missing"] == n - loaded and report["produced"] == n and report["loaded"] == loaded
    assert report["status"] == "failed"


def test_a_batch_loaded_twice_fails_the_audit_task_naming_both_batches(cluster, spark, tmp_path, yesterday,
                                                                     airflow_db):
    """A batch directory copied by hand under another batch id: the counts balance nowhere
    and the ranges overlap; the daily audit fails at once (no grace for duplicates)."""
    import shutil

    zk, n = produced_yesterday(cluster, yesterday, "dups", 60, 60_000)
    start, end = yesterday
    hook = LogbusHook(zookeeper=zk)
    record = load_batch(hook, spark, tmp_path, "dups", "dups", start, end)
    hook.close()
    copy = tmp_path / "dups" / "batch_id=copied-by-hand"
    shutil.copytree(tmp_path / "dups" / f"batch_id={record['batch_id']}", copy)
    data = json.loads((copy / "_logbus_batch.json").read_text())
    (copy / "_logbus_batch.json").write_text(json.dumps({**data, "batch_id": "copied-by-hand"}))

    state, report = daily_audit(zk, tmp_path, "dups", yesterday, grace_minutes=600)
    assert state == "failed"
    assert report["status"] == "failed" and report["duplicated"] == n and report["missing"] == 0
    pairs = {frozenset((o["after"], o["before"])) for o in report["overlaps"]}
    assert pairs == {frozenset(("copied-by-hand", record["batch_id"]))}
    assert "loaded by both batch" in report["reasons"][0]


def test_data_loss_fails_by_default_naming_the_lost_range(cluster, tmp_path, yesterday):
    zk, earliest = _topic_with_deleted_segments(cluster)
    hook = LogbusHook(zookeeper=zk)
    start, end = yesterday
    with pytest.raises(DataLossError, match=rf"bytes \[0, {earliest}\) \({earliest} bytes\) were deleted"):
        plan_batch(hook.get_conn(), DirectoryTarget(tmp_path, "old"), "old", start, end, group="loader")
    hook.close()
    assert not (tmp_path / "old").exists()


def test_data_loss_skip_loads_from_earliest_and_the_audit_reports_the_loss(cluster, spark, tmp_path, yesterday):
    zk, earliest = _topic_with_deleted_segments(cluster)
    hook = LogbusHook(zookeeper=zk)
    start, end = yesterday
    record = load_batch(hook, spark, tmp_path, "old", "old", start, end, group="loader", on_data_loss="skip")
    (r,) = record["ranges"]
    assert (r["lost_start"], r["lost_end"], r["start"]) == (0, earliest, earliest)
    report = audit(hook, tmp_path, "old", start, end)
    hook.close()
    assert report["data_loss"] == [{"batch_id": record["batch_id"], "partition": 0, "lost_start": 0,
                                    "lost_end": earliest, "bytes": earliest}]
    assert report["missing"] == earliest // ENTRY == report["produced"] - record["row_count"]


def _topic_with_deleted_segments(cluster) -> tuple[str, int]:
    """A 1-partition topic whose oldest segments time-based retention deleted (messages
    stamped 14 hours ago, retention 12 hours; monitoring events are stamped now and stay),
    and a group whose committed offset (0) points into the deleted bytes.
    Returns (zk, earliest offset)."""
    cluster.start_broker(0, {"num.partitions": 1, "log.segment.bytes": 5 * ENTRY + 10,
                             "log.retention.ms": 12 * HOUR, "log.retention.check.interval.ms": 100})
    zk = cluster.zookeeper
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    t0 = int(today.timestamp() * 1000) - 14 * HOUR
    produce(zk, "old", [t0 + i * 60_000 for i in range(40)], value_bytes=VALUE_BYTES, keyed=False,
                one_entry_each=True)
    with LogbusCluster(zk) as c:
        # every message is past retention, so retention ends with only the active segment
        # left; wait for that, or a snapshot may see an earlier `earliest` than the load
        earliest = wait_until(lambda: _only_active_segment_left(c, "old"), 30, "retention to delete old segments")
        c.set_group_offsets("loader", "old", {0: 0})
    assert earliest % ENTRY == 0
    return zk, earliest


def _only_active_segment_left(c, topic: str) -> int | None:
    starts = c.segment_starts(topic, 0)
    return starts[0] if len(starts) == 1 and starts[0] == c.earliest(topic, 0) and starts[0] > 0 else None
