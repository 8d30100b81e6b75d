"""The Iceberg target's commit: one snapshot per batch with its offsets in the summary,
the catalog's compare-and-swap under real concurrent processes and SIGKILL, on a SQLite
catalog, on a real PostgreSQL server, and on PostgreSQL with the warehouse in a bucket
of a real S3 API server."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_logbus.plan import BatchPlan
from airflow_provider_logbus.schema import SchemaError
from airflow_provider_logbus.targets.iceberg import IcebergTarget
from airflow_provider_logbus.targets.iceberg_tables import embedded_catalog

from .stagingutil import child_command, create_table_command, offsets, plan, wait_all, write_staging

ROOT = Path(__file__).parents[2]
VALUE = pa.schema([pa.field("n", pa.int64())])


def ranges(*spans: tuple[int, int, int]) -> list[dict]:
    return [{"topic": "t", "partition": p, "start": s, "end": e} for p, s, e in spans]


@pytest.fixture(params=["sqlite", "postgresql", "postgresql+s3"])
def catalog(request, tmp_path) -> dict:
    """Catalog properties: the embedded SQLite file, a SQL catalog on PostgreSQL, or the
    production shape — PostgreSQL with the warehouse in a bucket of a real S3 API server
    (harness.s3)."""
    if request.param == "sqlite":
        return embedded_catalog(str(tmp_path / "wh"))
    server = request.getfixturevalue("postgres")
    uri = server.create_database(f"iceberg_{tmp_path.name[-20:].lower().replace('-', '_')}")
    if request.param == "postgresql+s3":
        s3 = request.getfixturevalue("s3_server")
        bucket = s3.create_bucket(f"wh-{uuid.uuid4().hex[:12]}")
        return {"type": "sql", "uri": uri, "warehouse": f"{bucket}/warehouse", **s3.properties()}
    return {"type": "sql", "uri": uri, "warehouse": f"file://{tmp_path / 'wh'}"}


def target_for(catalog: dict, tmp_path: Path) -> IcebergTarget:
    target = IcebergTarget("tbl", catalog_properties=catalog, warehouse=str(tmp_path / "wh"))
    target.ensure_schema(VALUE)
    return target


def staged(target: IcebergTarget, batch_id: str, attempt: int, spans: list[dict]) -> str:
    staging = target.prepare_staging(batch_id, attempt)
    write_staging(staging, spans, layout="iceberg", storage=target.storage)
    return staging


def table_offsets(target: IcebergTarget) -> list[tuple[int, int]]:
    t = target.table_or_fail().scan(selected_fields=("partition", "offset")).to_arrow()
    return sorted(zip(t["partition"].to_pylist(), t["offset"].to_pylist()))


def batch_snapshots(target: IcebergTarget, batch_id: str) -> int:
    return sum(s.summary.additional_properties.get("logbus.batch-id") == batch_id
               for s in target.table_or_fail().metadata.snapshots)


def run_children(tmp_path: Path, catalog: dict, children: list[tuple[dict, str]], kill_at: str | None = None,
                 together: bool = True) -> list[subprocess.CompletedProcess | int]:
    barrier = tmp_path / "go"
    procs = [subprocess.Popen(child_command(str(tmp_path / "wh"), p, staging, str(tmp_path / f"r{i}.json"),
                                            barrier=str(barrier) if together else None, kill_at=kill_at,
                                            kind="iceberg", catalog=catalog), cwd=ROOT)
             for i, (p, staging) in enumerate(children)]
    barrier.touch()
    return wait_all(procs, timeout=180)


def test_a_batch_is_one_snapshot_carrying_its_offsets(catalog, tmp_path):
    target = target_for(catalog, tmp_path)
    spans = ranges((0, 0, 1000), (1, 0, 500))
    result = target.commit(BatchPlan.from_dict(plan("b1", spans)), staged(target, "b1", 1, spans), "run-1")
    assert result.published_now and result.record.row_count == 15
    table = target.table_or_fail()
    summary = table.current_snapshot().summary.additional_properties
    assert summary["logbus.batch-id"] == "b1" and json.loads(summary["logbus.ranges"]) == spans
    assert summary["logbus.run-id"] == "run-1" and json.loads(summary["logbus.counts"])[0]["count"] == 15
    assert json.loads(table.properties["logbus.committed-offsets"]) == {"t": {"0": 1000, "1": 500}}
    assert str(table.spec().fields[0].transform) == "hour"
    assert table_offsets(target) == sorted([(0, o) for o in offsets(0, 1000)] + [(1, o) for o in offsets(0, 500)])
    assert target.committed_end_offsets("t") == {0: 1000, 1: 500}


def test_overlapping_batches_committed_at_once_load_every_message_once(catalog, tmp_path):
    target = target_for(catalog, tmp_path)
    spans = ranges((0, 0, 3000))
    codes = run_children(tmp_path, catalog, [(plan(f"b{i}", spans), staged(target, f"b{i}", 1, spans))
                                             for i in range(4)])
    assert codes == [0, 0, 0, 0]
    assert table_offsets(target) == [(0, o) for o in offsets(0, 3000)]
    results = [json.loads((tmp_path / f"r{i}.json").read_text()) for i in range(4)]
    assert sum(r["row_count"] for r in results) == 30 and all(r["published_now"] for r in results)


def test_two_attempts_of_one_batch_at_once_make_one_snapshot(catalog, tmp_path):
    target = target_for(catalog, tmp_path)
    spans = ranges((0, 0, 2000))
    codes = run_children(tmp_path, catalog, [(plan("b1", spans), staged(target, "b1", 1, spans)),
                                             (plan("b1", spans), staged(target, "b1", 2, spans))])
    assert codes == [0, 0]
    assert batch_snapshots(target, "b1") == 1
    assert table_offsets(target) == [(0, o) for o in offsets(0, 2000)]


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql+s3"], indirect=True)
@pytest.mark.parametrize("kill_at", ["before-catalog-commit", "after-catalog-commit", "before-rejects"])
def test_a_commit_killed_at_each_step_is_finished_by_its_retry_exactly_once(catalog, tmp_path, kill_at):
    target = target_for(catalog, tmp_path)
    spans = ranges((0, 0, 1500))
    staging = staged(target, "b1", 1, spans)
    assert run_children(tmp_path, catalog, [(plan("b1", spans), staging)], kill_at=kill_at, together=False) == [-9]
    retry = target.commit(BatchPlan.from_dict(plan("b1", spans)), staging, "retry")
    assert batch_snapshots(target, "b1") == 1
    assert table_offsets(target) == [(0, o) for o in offsets(0, 1500)]
    assert retry.published_now == (kill_at == "before-catalog-commit")
    referenced = {f.file_path for f in target.table_or_fail().scan().plan_files() for f in [f.file]}
    assert referenced and all(target.storage.exists(p) for p in referenced)


def test_a_declared_optional_field_evolves_the_table_and_a_narrowing_is_refused(tmp_path):
    target = target_for(embedded_catalog(str(tmp_path / "wh")), tmp_path)
    target.ensure_schema(pa.schema([pa.field("n", pa.int64()), pa.field("page", pa.string())]))
    assert "page" in target.table_or_fail().schema().column_names
    with pytest.raises(SchemaError, match="n"):
        target.ensure_schema(pa.schema([pa.field("n", pa.int32())]))
    assert "page" in target.table_or_fail().schema().column_names


def test_five_loads_creating_one_new_table_at_once_all_succeed_first_time(catalog, tmp_path):
    """Five runs' first loads on a new table, released at the same moment in five
    processes: each creates the table (and its rejects table) or finds it created by
    another, and checks it against the declaration; none fails."""
    barrier = tmp_path / "go"
    procs = [subprocess.Popen(create_table_command(str(tmp_path / "wh"), "web", "server string, n long NOT NULL",
                                                   barrier=str(barrier), catalog=catalog),
                              cwd=ROOT, stderr=subprocess.PIPE, text=True) for _ in range(5)]
    barrier.touch()
    codes = wait_all(procs, timeout=180)
    assert codes == [0] * 5, [p.stderr.read()[-2000:] for p in procs if p.returncode]
    target = IcebergTarget("web", catalog_properties=catalog)
    try:
        table = target.table_or_fail()
        assert table.schema().column_names[-2:] == ["server", "n"] and table.schema().find_field("n").required
        assert target._load(target.rejects_identifier) is not None
    finally:
        target.close()


def test_an_iceberg_table_without_a_declared_schema_is_refused(tmp_path):
    target = IcebergTarget("tbl", warehouse=str(tmp_path / "wh"))
    with pytest.raises(Exception, match="declared value schema"):
        target.ensure_schema(None)


@pytest.mark.slow
def test_a_batch_loads_end_to_end_into_an_iceberg_table_on_postgresql(module_cluster, spark, postgres, tmp_path):
    """Broker → snapshot → Spark load job (iceberg layout) → commit on a PostgreSQL
    catalog → pyiceberg and Spark readers; then the next batch starts at the table's end.
    The messages share entries — idempotent producer batches, gzip and zstd ones, and
    compressed sets without idempotence — and `(topic, partition, offset)` is still the
    table's row key: no repeat, one row per message, each at the offset a native
    consumer reads it at (issue 35: they used to share their entry's offset)."""
    from datetime import datetime, timedelta, timezone

    from airflow_provider_logbus.batch import plan_batch
    from airflow_provider_logbus.cluster import LogbusCluster
    from airflow_provider_logbus.spark.iceberg import read_iceberg
    from airflow_provider_logbus.spark.load_job import run_load

    from .helpers import BATCHED_AND_COMPRESSED, all_messages, entry_kinds, produce

    zk = module_cluster.zookeeper
    now = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    produce(zk, "pg_events", [int((now - timedelta(hours=2)).timestamp() * 1000) + i * 30_000 for i in range(120)],
            settings=BATCHED_AND_COMPRESSED)
    stored = entry_kinds(zk, "pg_events")
    assert stored["entries"] <= 120 / 2 and stored["compressed"] and stored["batches"], stored
    uri = postgres.create_database("iceberg_end_to_end")
    target = IcebergTarget("pg_events", catalog_properties={"type": "sql", "uri": uri,
                                                            "warehouse": f"file://{tmp_path / 'wh'}"})
    target.ensure_schema(pa.schema([pa.field("server", pa.string()), pa.field("n", pa.int64())]))
    with LogbusCluster(zk) as cluster:
        plan = plan_batch(cluster, target, "pg_events", now - timedelta(hours=2), now - timedelta(hours=1))
    staging = target.prepare_staging(plan.batch_id, 1)
    run_load(spark, plan.ranges, staging, zookeeper=zk, value_format="json",
             schema="server string, n long", layout="iceberg")
    result = target.commit(plan, staging, "end-to-end")
    native = sorted((p, m.offset, json.loads(m.value)["n"]) for p, m in all_messages(zk, "pg_events"))
    rows = target.table_or_fail().scan(selected_fields=("topic", "partition", "offset", "n")).to_arrow()
    keys = list(zip(rows["topic"].to_pylist(), rows["partition"].to_pylist(), rows["offset"].to_pylist()))
    assert result.record.row_count == len(set(keys)) == len(keys) == len(native) == 120
    assert sorted(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), rows["n"].to_pylist())) == native
    table = target.table_or_fail()
    assert read_iceberg(spark, table).count() == 120
    assert read_iceberg(spark, table, "n >= 100").filter("n >= 100").count() == 20
    with LogbusCluster(zk) as cluster:
        following = plan_batch(cluster, target, "pg_events", now - timedelta(hours=1), now)
    assert {r.partition: r.start for r in following.ranges} == target.committed_end_offsets("pg_events")
    assert all(r.end == r.start for r in following.ranges)
    target.close()


def test_a_table_made_by_an_earlier_version_gets_todays_properties_from_the_next_load(tmp_path):
    """Properties such as the manifest size (a year of hours in one manifest made every
    reader of one hour read all of them: BENCHMARKS.md, the year run) reach tables that
    exist already; so does the table's documentation of its row key (its comment and the
    `offset` column's doc), which a new table has from the start."""
    from airflow_provider_logbus.targets.iceberg_tables import OFFSET_DOC, ROW_KEY, TABLE_PROPERTIES

    target = target_for(embedded_catalog(str(tmp_path / "wh")), tmp_path)
    assert target.table_or_fail().properties["comment"] == ROW_KEY["comment"]
    assert "(topic, partition, offset) is the row key" in ROW_KEY["comment"]
    assert target.table_or_fail().schema().find_field("offset").doc == OFFSET_DOC
    with target.table_or_fail().transaction() as tx:
        tx.remove_properties(*TABLE_PROPERTIES, *ROW_KEY)
    with target.table_or_fail().update_schema() as update:
        update.update_column("offset", doc="an entry's byte position")
    assert not {*TABLE_PROPERTIES, *ROW_KEY} & set(target.table_or_fail().properties)
    target.ensure_schema(VALUE)
    properties = target.table_or_fail().properties
    assert {k: properties.get(k) for k in {**TABLE_PROPERTIES, **ROW_KEY}} == {**TABLE_PROPERTIES, **ROW_KEY}
    assert target.table_or_fail().schema().find_field("offset").doc == OFFSET_DOC
    assert "commit.manifest.target-size-bytes" in TABLE_PROPERTIES


def test_a_table_declared_with_small_integers_takes_its_next_loads(tmp_path):
    """Iceberg stores tinyint and smallint as int: compared as declared, the second load
    refused the table's own columns ("changes type from int to smallint")."""
    target = target_for(embedded_catalog(str(tmp_path / "wh")), tmp_path)
    declared = pa.schema([pa.field("s", pa.int16()), pa.field("geo", pa.struct([pa.field("b", pa.int8())])),
                          pa.field("ids", pa.list_(pa.int16()))])
    target.ensure_schema(declared)
    assert target.check_schema(declared) == []
    target.ensure_schema(declared)
    widened = pa.schema([pa.field("s", pa.int64()), *list(declared)[1:]])
    assert target.check_schema(widened) == ["s"]
    target.ensure_schema(widened)
    assert str(target.table_or_fail().schema().find_field("s").field_type) == "long"
