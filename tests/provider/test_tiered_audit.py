"""The audit at every tier: rows added to a table outside the commit protocol (by hand,
with pyiceberg or a file copy) fail the table tier naming the file, on both targets; a
loss between a source cluster and the mirror is named at the mirror tier, with real
brokers, producers and a load on Spark."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from broker.client.monitoring import MONITORING_TOPIC, MonitoringCounter, sum_counts
from broker.client.producer import Producer
from broker.common.message import iter_messages

from airflow_provider_logbus.batch import audit_inputs, await_broker_counts
from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.completeness import build_report, judge
from airflow_provider_logbus.hooks.logbus import LogbusHook
from airflow_provider_logbus.plan import BatchPlan
from airflow_provider_logbus.targets import CommitTarget, open_target
from airflow_provider_logbus.targets.iceberg_tables import local_path
from harness.cluster import LocalCluster
from harness.process import wait_until

from .conftest import new_chroot
from .helpers import produce, yesterday_start
from .stagingutil import T0, plan, write_staging
from .test_audit_and_retention import HOUR, load_batch
from .test_iceberg_target import VALUE

ROWS = 15  # the batch: offsets 0..1500 of partition 0, every one stamped in the hour of T0


@pytest.fixture(params=["directory", "iceberg"])
def committed(request, tmp_path) -> CommitTarget:
    """A table of either target holding one batch committed by the protocol."""
    target = open_target(request.param, "tbl", warehouse=str(tmp_path / "wh"))
    target.ensure_schema(VALUE)
    spans = [{"topic": "t", "partition": 0, "start": 0, "end": ROWS * 100}]
    staging = target.prepare_staging("b1", 1)
    write_staging(staging, spans, layout=target.layout)
    target.commit(BatchPlan.from_dict(plan("b1", spans)), staging, "run")
    yield target
    target.close()


def audit_table(target: CommitTarget) -> dict:
    """The verdict on the table's hour, the producers having reported every batch row."""
    contents = target.contents()
    report = build_report("tbl", "t", T0, T0 + HOUR, {("t", T0): ROWS}, contents.batches, 0.999,
                          files=contents.files)
    return judge(report, now_ms=T0 + 10 * HOUR, grace_ms=0)


def batch_file(target: CommitTarget) -> Path:
    (first, *_) = [f for f in target.contents().files if f.batch_id == "b1"]
    return Path(local_path(first.path))


def add_by_hand(target: CommitTarget, rows, name: str) -> dict:
    """Put `rows` into the table outside the commit protocol, as a user would: a Parquet
    file copied into the batch's hour directory, or `add_files` with pyiceberg. The file
    as the audit should name it: path, rows, the snapshot that added it (Iceberg)."""
    if target.layout == "directory":
        path = batch_file(target).parent / name
        pq.write_table(rows, path)
        return {"path": str(path), "rows": rows.num_rows, "snapshot_id": None}
    table = target.table_or_fail()
    path = Path(local_path(table.location())) / "data" / "by-hand" / name
    path.parent.mkdir(parents=True)
    pq.write_table(rows, path)
    table.add_files([str(path)])
    return {"path": str(path), "rows": rows.num_rows,
            "snapshot_id": target.table_or_fail().current_snapshot().snapshot_id}


def test_the_table_as_committed_passes_every_tier(committed):
    report = audit_table(committed)
    assert report["status"] == "ok" and report["tiers"] == ["producer", "table"]
    (hour,) = report["hours"]
    assert (hour["produced"], hour["loaded"], hour["recorded"], hour["unrecorded"]) == (ROWS, ROWS, ROWS, 0)


def test_a_file_added_outside_the_commit_protocol_fails_the_audit_naming_it(committed):
    rows = pq.read_table(batch_file(committed)).slice(0, 7)
    added = add_by_hand(committed, rows, f"part-by-hand-{uuid.uuid4().hex}.parquet")
    report = audit_table(committed)
    (hour,) = report["hours"]
    assert report["status"] == "failed" and hour["status"] == "duplicated"
    assert (hour["loaded"], hour["recorded"], hour["unrecorded"]) == (ROWS + 7, ROWS, 7)
    assert hour["outside_batches"] == [added]
    assert hour["duplicated_at"] == ["table"] and hour["missing_at"] == []
    assert any(added["path"] in reason and "table tier" in reason for reason in report["reasons"])
    if added["snapshot_id"] is not None:  # Iceberg: the snapshot that added it, which the Airflow page shows
        snapshot = committed.snapshot(added["snapshot_id"])
        assert (snapshot["snapshot_id"], snapshot["operation"]) == (str(added["snapshot_id"]), "append")
        assert snapshot["summary"]["added-records"] == "7" and "logbus.batch-id" not in snapshot["summary"]
    assert committed.snapshot(1234567) is None


def test_a_batch_whose_rows_are_added_again_is_a_duplicate_at_the_table_tier(committed):
    again = add_by_hand(committed, pq.read_table(batch_file(committed)), "part-again.parquet")
    report = audit_table(committed)
    (hour,) = report["hours"]
    table_tier = hour["tiers"][-1]
    assert (table_tier["tier"], table_tier["duplicated"], table_tier["missing"]) == ("table", ROWS, 0)
    assert hour["status"] == "duplicated" and report["status"] == "failed"
    assert hour["outside_batches"] == [again]
    assert "duplicated row(s) at the table tier" in report["reasons"][0]


def test_a_data_file_deleted_from_a_batch_is_missing_at_the_table_tier(tmp_path):
    """The directory target's files are plain files: deleting one leaves a record that
    claims rows the table no longer holds; the audit names the batch."""
    target = open_target("directory", "tbl", warehouse=str(tmp_path / "wh"))
    spans = [{"topic": "t", "partition": 0, "start": 0, "end": ROWS * 100}]
    staging = target.prepare_staging("b1", 1)
    write_staging(staging, spans)
    target.commit(BatchPlan.from_dict(plan("b1", spans)), staging, "run")
    batch_file(target).unlink()
    report = audit_table(target)
    (hour,) = report["hours"]
    assert hour["missing_at"] == ["table"] and hour["unrecorded"] == -ROWS
    assert hour["batches_off"] == [{"batch_id": "b1", "recorded": ROWS, "held": 0}]
    assert report["status"] == "failed"


# --------------------------------------------------------------------- the mirror tier


def messages(cluster: LogbusCluster, topic: str) -> list:
    return [m for p, o in cluster.partition_offsets(topic).items()
            for base, buf in cluster.read_range(topic, p, o.earliest, o.latest) for m in iter_messages(buf, base)]


def mirror(source: LogbusCluster, target_zk: str, topic: str, drop: int) -> int:
    """What a mirror does, in a few lines: copy the source's monitoring topic and
    `topic` into the target cluster — all but the first `drop` messages, lost on the
    way. Returns the messages copied. (Its own events: `publish_mirror_events`.)"""
    with Producer(zookeeper=target_zk, acks=-1, monitoring=False) as producer:
        for event in source.monitoring_events():
            producer.send(MONITORING_TOPIC, json.dumps(event).encode())
        copied = messages(source, topic)[drop:]
        for m in copied:
            producer.send(topic, m.value, key=m.key, timestamp=m.timestamp)
        assert producer.flush(30).ok
    return len(copied)


def publish_mirror_events(source: LogbusCluster, source_name: str, target_zk: str, topic: str, drop: int) -> None:
    """The mirror's tier-"mirror" events for what it copied, into the target cluster."""
    counter = MonitoringCounter("mirror-1", tier="mirror", source=source_name)
    counter.record(topic, messages(source, topic)[drop:])
    with Producer(zookeeper=target_zk, acks=-1, monitoring=False) as producer:
        for key, value in counter.events():
            producer.send(MONITORING_TOPIC, value, key=key)
        assert producer.flush(30).ok


def produced(cluster: LogbusCluster, topic: str) -> int:
    return sum(w.count for (t, _), w in sum_counts(cluster.monitoring_events()).items() if t == topic)


@pytest.mark.slow
def test_messages_lost_between_the_source_and_the_mirror_are_missing_at_the_mirror_tier(
        cluster, zookeeper, spark, tmp_path):
    """A source cluster with real producers, an offline cluster the mirror copies into
    (losing 5 messages of 10:00) and a table loaded from the offline cluster by Spark.
    Audited before the mirror's events arrive, the deployment reads producer-only and
    the loss shows producer → table; with them, it is named at the mirror tier."""
    day = yesterday_start()
    t0 = int(day.timestamp() * 1000) + 10 * HOUR
    cluster.start_broker(0, {"num.partitions": 2})
    produce(cluster.zookeeper, "clicks", [t0 + i * 40_000 for i in range(150)])  # 10:00 (90) and 11:00 (60)
    offline = LocalCluster(new_chroot(zookeeper), tmp_path / "offline", settings={"log.flush.interval.ms": 20})
    end = t0 + 14 * HOUR
    try:
        offline.start_broker(0, {"num.partitions": 2})
        with LogbusCluster(cluster.zookeeper) as source, LogbusCluster(offline.zookeeper) as target_side:
            wait_until(lambda: produced(source, "clicks") == 150, 30, "the producers' events")
            copied = mirror(source, offline.zookeeper, "clicks", drop=5)
            wait_until(lambda: produced(target_side, "clicks") == 150 and sum(
                1 for _ in messages(target_side, "clicks")) == copied, 30, "the mirrored messages and events")
            hook = LogbusHook(zookeeper=offline.zookeeper)
            record = load_batch(hook, spark, tmp_path / "wh", "clicks", "clicks", day, day + timedelta(days=1))
            assert record["row_count"] == copied == 145
            target = open_target("directory", "clicks", warehouse=str(tmp_path / "wh"))
            inputs = await_broker_counts(hook.get_conn(), audit_inputs(hook.get_conn(), target), "clicks", 60)
            producer_only = judge(inputs.report("clicks", "clicks", t0, end, 0.999), now_ms=end + HOUR, grace_ms=0)
            publish_mirror_events(source, "dc-east", offline.zookeeper, "clicks", drop=5)
            tiered = wait_until(lambda: (r := audit_inputs(hook.get_conn(), target).report(
                "clicks", "clicks", t0, end, 0.999))["mirrored"] and r, 30, "the mirror's events")
            hook.close()
            target.close()
    finally:
        offline.stop()
    # the offline cluster's brokers committed 145: the loss is before them, not at the table
    assert producer_only["tiers"] == ["producer", "broker", "table"] and producer_only["mirrored"] is None
    assert (producer_only["produced"], producer_only["counted"], producer_only["loaded"],
            producer_only["missing"]) == (150, 145, 145, 5)
    assert {h["hour"][-6:]: h["missing_at"] for h in producer_only["hours"] if h["produced"]} == {
        "10:00Z": ["broker"], "11:00Z": []}

    judge(tiered, now_ms=end + HOUR, grace_ms=0)
    assert tiered["tiers"] == ["producer", "mirror", "broker", "table"] and tiered["sources"] == ["dc-east"]
    ten = next(h for h in tiered["hours"] if h["hour"].endswith("10:00Z"))
    assert [(t["tier"], t["count"], t.get("missing", 0)) for t in ten["tiers"]] == [
        ("producer", 90, 0), ("mirror", 85, 5), ("broker", 85, 0), ("table", 85, 0)]
    assert ten["tiers"][1]["sources"] == {"dc-east": 85} and ten["missing_at"] == ["mirror"]
    assert tiered["status"] == "failed" and "5 missing at the mirror tier (5)" in tiered["reasons"][-1]
