"""The example hourly DAG into an Iceberg table whose warehouse is a bucket of a real S3
API server (harness.s3: moto's server on loopback): the catalog connection (a SQLite
catalog, warehouse `s3://...`) names an `aws` connection holding the keys, the region
and the endpoint, as a user configures it (docs/provider.md, "Object storage").

One scenario: interval 1 with its first spark-submit SIGKILLed once Spark had written
into the attempt's staging prefix; interval 2, with values that do not parse; then the
example maintenance DAG. Every
message is in the table exactly once, read back by pyiceberg and by Spark, and the
secret key shows in no command line, task log or snapshot summary.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.spark.iceberg import read_iceberg
from airflow_provider_logbus.storage import Storage
from airflow_provider_logbus.targets.iceberg import IcebergTarget
from airflow_provider_logbus.ui.status import reject_rows
from harness.process import wait_until
from harness.s3 import ACCESS_KEY, REGION, SECRET_KEY

from .conftest import load_dag, use_logbus_connection
from .helpers import all_offsets, process_output, produce, produce_values, yesterday_start
from .test_hourly_dag import KillFirstLoad, find_load_job, task_states
from .test_iceberg_dag import BAD_VALUES, table_offsets, utc
from .test_secured_dag import CommandLines

pytestmark = [pytest.mark.slow, pytest.mark.long]
HOUR = 3_600_000
TOPIC = TABLE = "s3_clicks"
SCHEMA = "server string, n long NOT NULL, ts_ms long"


def staging_of(marker: str) -> str | None:
    """The `--staging` argument of the running load job whose command line holds `marker`."""
    pid = find_load_job(marker)
    if pid is None:
        return None
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return None
    return args[args.index("--staging") + 1] if "--staging" in args else None


@pytest.fixture(scope="module")
def scenario(module_cluster, airflow_db, s3_server, tmp_path_factory):
    """The scenario, its connections and settings in this process's environment only
    meanwhile: later tests of the same worker (test_overlapping_runs' deployment inherits
    it) must not find the S3 catalog connection named there."""
    saved = dict(os.environ)
    try:
        yield run_scenario(module_cluster, s3_server, tmp_path_factory)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_scenario(module_cluster, s3_server, tmp_path_factory) -> dict:
    zk = module_cluster.zookeeper
    use_logbus_connection(zk)
    work = tmp_path_factory.mktemp("s3-dag")
    bucket = s3_server.create_bucket(f"lake-{uuid.uuid4().hex[:8]}")
    os.environ["AIRFLOW_CONN_LOGBUS_S3_KEYS"] = json.dumps({
        "conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
        "extra": {"endpoint_url": s3_server.endpoint, "region_name": REGION}})
    os.environ["AIRFLOW_CONN_LOGBUS_ICEBERG_S3"] = json.dumps({
        "conn_type": "logbus_iceberg", "host": f"sqlite:///{work / 'catalog.db'}",
        "extra": {"warehouse": f"{bucket}/warehouse", "aws_conn_id": "logbus_s3_keys"}})
    env = {"LOGBUS_TOPIC": TOPIC, "LOGBUS_TABLE": TABLE, "LOGBUS_WAREHOUSE": str(work / "local"),
           "LOGBUS_CATALOG_CONN_ID": "logbus_iceberg_s3", "LOGBUS_TARGET": "iceberg", "LOGBUS_GROUP": "loader",
           "LOGBUS_SENSOR_GRACE_MINUTES": "0", "LOGBUS_AUDIT_GRACE_MINUTES": "0", "LOGBUS_RETRY_DELAY_SECONDS": "0",
           "LOGBUS_VALUE_SCHEMA": SCHEMA, "LOGBUS_DAILY_AUDIT_GRACE_MINUTES": "0", "LOGBUS_MAX_REJECT_RATE": "0.5"}
    dag = load_dag("logbus_hourly_load.py", env)
    h0 = int(yesterday_start().timestamp() * 1000) + 10 * HOUR
    ends = [h0 + HOUR, h0 + 2 * HOUR]

    def tail_past(end: int) -> None:
        with LogbusCluster(zk) as c:
            wait_until(lambda: all(c.has_data_after(TOPIC, p, end) for p in c.partitions(TOPIC)), 30, "tail data")

    produce(zk, TOPIC, [h0 + i * (HOUR // 100) for i in range(100)] + [ends[0] + 1000 * i for i in range(1, 9)])
    tail_past(ends[0])
    wait_until(lambda: len(all_offsets(zk, TOPIC)) == 108, 30, "all 108 messages visible")
    storage = Storage(s3_server.properties())
    marker = f"{utc(h0):%Y%m%dT%H%M%S}_{utc(ends[0]):%Y%m%dT%H%M%S}.1"
    killer = KillFirstLoad(marker, written=lambda: bool((s := staging_of(marker)) and storage.files(s, ".parquet")))
    commands = CommandLines()
    commands.start()
    killer.start()
    out = {"env": env, "ends": ends, "bucket": bucket, "storage": storage, "killed_attempt": marker}
    output = work / "output.log"
    try:
        with process_output(output):
            out["dr1"] = dag.test(logical_date=utc(ends[0]))
            out["killed"], out["states_1"] = killer.killed, task_states(out["dr1"])
            produce(zk, TOPIC, [ends[0] + 60_000 + i * (HOUR // 80) for i in range(80)])
            produce_values(zk, TOPIC, BAD_VALUES, ends[0] + 120_000)
            produce(zk, TOPIC, [ends[1] + 1000 * i for i in range(1, 9)])
            tail_past(ends[1])
            out["offsets"] = wait_until(lambda: o if len(o := all_offsets(zk, TOPIC)) == 200 else None, 30,
                                        "all 200 messages visible")
            out["dr2"] = dag.test(logical_date=utc(ends[1]))
            out["states_2"] = task_states(out["dr2"])
            target = IcebergTarget(TABLE, catalog_properties={
                "type": "sql", "uri": f"sqlite:///{work / 'catalog.db'}", "warehouse": f"{bucket}/warehouse",
                **s3_server.properties()})
            out["rows"] = table_offsets(target)
            out["rejects"] = table_offsets(target, target.rejects_identifier)
            out["reject_rows"] = reject_rows(target, target.batches()[-1].batch_id)
            out["location"] = target.table_or_fail().location()
            out["files_before"] = {f.path for f in target.contents().files}
            out["maintenance"] = load_dag("logbus_table_maintenance.py", env).test(logical_date=utc(ends[1]))
            out["maintenance_states"] = task_states(out["maintenance"])
            out["files_after"] = {f.path for f in target.contents().files}
            out["rows_after_maintenance"] = table_offsets(target)
            out["table"] = target.table_or_fail()
            tables = [out["table"], target.tables.load(target.rejects_identifier),
                      target.tables.load(target.ledger.identifier)]
            out["summaries"] = json.dumps([{**s.summary.additional_properties, **t.properties}
                                           for t in tables if t is not None for s in t.metadata.snapshots])
            out["batches"] = target.batches()
            target.close()
    finally:
        killer.stop.set()
        commands.stop.set()
        commands.join()
    out["commands"] = commands.seen
    out["logs"] = output.read_text(errors="replace") + "".join(
        p.read_text(errors="replace") for p in Path(os.environ["AIRFLOW_HOME"]).rglob("*.log")
        if p.stat().st_mtime > time.time() - 1200)
    return out


def test_both_runs_succeed_and_the_killed_load_was_retried(scenario):
    assert scenario["killed"], "the first spark-submit was never seen writing to the bucket"
    assert str(scenario["dr1"].state) == "success", scenario["states_1"]
    assert scenario["states_1"]["load"] == ("success", 2)
    assert str(scenario["dr2"].state) == "success", scenario["states_2"]


def test_the_table_lives_in_the_bucket_and_holds_every_message_once(scenario):
    assert scenario["location"].startswith(scenario["bucket"] + "/")
    rows, rejects = scenario["rows"], scenario["rejects"]
    assert len(rows) == len(set(rows)) == 196 and len(rejects) == len(BAD_VALUES)
    assert set(rows) | set(rejects) == scenario["offsets"]
    assert scenario["files_before"] <= set(scenario["storage"].files(scenario["location"] + "/data", ".parquet"))


def test_the_rejected_values_are_read_back_from_the_bucket(scenario):
    answer = scenario["reject_rows"]
    assert answer["files"] and all(f.startswith(scenario["bucket"] + "/") for f in answer["files"])
    assert sorted(r["value"] for r in answer["rows"]) == sorted(v.decode() for v in BAD_VALUES)
    assert all(r["error"] for r in answer["rows"])


def test_the_killed_attempts_staging_is_gone_and_the_retrys_is_published(scenario):
    staging = scenario["location"] + "/data/_logbus_staging/"
    assert scenario["killed_attempt"].endswith(".1")
    assert not scenario["storage"].files(staging + scenario["killed_attempt"])
    assert scenario["storage"].files(staging + scenario["killed_attempt"][:-2] + ".2", ".parquet")


def test_spark_reads_the_table_back_from_the_bucket(scenario, spark):
    df = read_iceberg(spark, scenario["table"])
    rows = sorted((r["partition"], r["offset"]) for r in df.select("partition", "offset").collect())
    assert rows == scenario["rows"]
    assert df.filter("n IS NULL").count() == 0


def test_the_maintenance_dag_compacts_on_s3_changing_no_row(scenario):
    assert str(scenario["maintenance"].state) == "success", scenario["maintenance_states"]
    assert len(scenario["files_after"]) < len(scenario["files_before"])
    assert scenario["rows_after_maintenance"] == scenario["rows"]
    for path in scenario["files_after"]:
        assert scenario["storage"].exists(path)


def test_the_secret_key_is_in_no_command_line_log_or_summary(scenario):
    assert not [c for c in scenario["commands"] if SECRET_KEY.encode() in c]
    assert SECRET_KEY not in scenario["logs"]
    assert SECRET_KEY not in scenario["summaries"] and ACCESS_KEY not in scenario["summaries"]
    assert "load_job.py" in scenario["logs"], "no task log was read"
