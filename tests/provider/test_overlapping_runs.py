"""Exactly once under overlapping runs, through a real Airflow deployment (issue 8).

Deployed as a user would: PostgreSQL metadata database, API server, scheduler with the
LocalExecutor, dag-processor and triggerer (harness.airflow), the example DAG
`logbus_hourly_load` configured through its environment, real ZooKeeper and two brokers,
Spark through spark-submit.

Airflow 3 gives a backfill its own concurrency (10 runs unless `--max-active-runs`),
independent of the DAG's `max_active_runs=1`, and unpausing starts the latest scheduled
run beside it. So: unpause, then `airflow backfill create` over four past hours with
the default concurrency; five runs snapshot, load and commit at the same time, and the
table must still hold every message of the topic exactly once.

One scenario per target (module-scoped, parametrized; the table is read back through
`TARGETS`), each test checks one behaviour of it. The suite runs the Iceberg target
only (the scenario costs about two and a half minutes a target, against the suite's
15-minute budget); the directory target's compare-and-swap is raced by real processes
in test_commit_protocol.py, and `LOGBUS_OVERLAP_TARGETS=directory,iceberg` runs this
scenario on both.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest


from airflow_provider_logbus.cluster import LogbusCluster
from harness.airflow import AirflowDeployment
from harness.process import wait_until

from .conftest import ROOT
from .helpers import all_offsets, produce, table_rows

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(900)]

DAG_ID = "logbus_hourly_load"
SCHEMA = "server string, n long, ts_ms long"
FIRST_HOUR = datetime(2024, 1, 1, tzinfo=timezone.utc)
HOURS = 4
EVENTS_PER_HOUR = 600
HOUR_MS = 3_600_000


def directory_rows(warehouse: Path, table: str) -> list[tuple[int, int]]:
    return [(r["partition"], r["offset"]) for r in table_rows(warehouse / table)]


def iceberg_rows(warehouse: Path, table: str) -> list[tuple[int, int]]:
    from airflow_provider_logbus.targets.iceberg import IcebergTarget

    target = IcebergTarget(table, warehouse=str(warehouse))
    try:
        t = target.table_or_fail().scan(selected_fields=("partition", "offset")).to_arrow()
    finally:
        target.close()
    return list(zip(t["partition"].to_pylist(), t["offset"].to_pylist()))


# target name (LOGBUS_TARGET) -> (partition, offset) of every row of the table, duplicates kept
TARGETS = {"directory": directory_rows, "iceberg": iceberg_rows}
SCENARIO_TARGETS = sorted(os.environ.get("LOGBUS_OVERLAP_TARGETS", "iceberg").split(","))
DOWNSTREAM = "logbus_complete_hours"


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def max_overlap(spans: list[tuple[datetime, datetime]]) -> int:
    """The largest number of spans open at one moment."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1]))
    most = current = 0
    for _, step in events:
        current += step
        most = max(most, current)
    return most


def report_logs(request, deployment: AirflowDeployment) -> None:
    """Components' log tails and failed tasks' logs, on the terminal (a module fixture's
    teardown output is otherwise not shown)."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    text = deployment.log_tails(60)
    if reporter is not None:
        reporter.write_line(text)
    else:
        sys.__stderr__.write(text)


@pytest.fixture(scope="module", params=SCENARIO_TARGETS)
def scenario(request, module_cluster, postgres, tmp_path_factory):
    target = request.param
    zk = module_cluster.zookeeper
    topic = table = f"web_{target}"
    group = f"loader_{target}"
    warehouse = tmp_path_factory.mktemp(f"warehouse-{target}")

    # EVENTS_PER_HOUR events in each of the four hours, then a few stamped two hours from
    # now: every partition then holds data past every run's interval end (the sensors'
    # condition), the latest scheduled run's hour included, even if the hour turns
    start = ms(FIRST_HOUR)
    stamps = [start + i * (HOURS * HOUR_MS // (HOURS * EVENTS_PER_HOUR)) for i in range(HOURS * EVENTS_PER_HOUR)]
    future = ms(datetime.now(timezone.utc) + timedelta(hours=2))
    produce(zk, topic, stamps + [future + 1000 * i for i in range(8)])
    with LogbusCluster(zk) as c:
        wait_until(lambda: all(c.has_data_after(topic, p, future - 1) for p in c.partitions(topic)), 30, "tail data")
    offsets = all_offsets(zk, topic)

    dags = tmp_path_factory.mktemp(f"dags-{target}")
    shutil.copy(ROOT / "dags" / "examples" / "logbus_hourly_load.py", dags)
    shutil.copy(ROOT / "dags" / "examples" / f"{DOWNSTREAM}.py", dags)
    env = {
        "LOGBUS_TARGET": target, "LOGBUS_TOPIC": topic, "LOGBUS_TABLE": table, "LOGBUS_WAREHOUSE": str(warehouse),
        "LOGBUS_GROUP": group, "LOGBUS_SENSOR_GRACE_MINUTES": "0", "LOGBUS_AUDIT_GRACE_MINUTES": "0",
        "LOGBUS_RETRY_DELAY_SECONDS": "2", "LOGBUS_VALUE_SCHEMA": SCHEMA,
        "AIRFLOW_CONN_LOGBUS_DEFAULT": json.dumps({"conn_type": "logbus", "extra": {"zookeeper": zk}}),
        "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    deployment = AirflowDeployment(tmp_path_factory.mktemp(f"airflow-{target}"),
                                   postgres.create_database(f"airflow_{target}"), dags, env, parallelism=4)
    failed_before = request.session.testsfailed
    began = time.monotonic()
    try:
        deployment.start()
        deployment.wait_for_dag(DAG_ID)
        deployment.wait_for_dag(DOWNSTREAM)
        deployment.unpause(DOWNSTREAM)  # one run per hour the audits announce complete
        deployment.unpause(DAG_ID)  # the scheduler creates the latest hour's run
        last = FIRST_HOUR + timedelta(hours=HOURS - 1)
        deployment.backfill(DAG_ID, FIRST_HOUR.isoformat(), last.isoformat())  # default concurrency
        runs = deployment.wait_for_runs(DAG_ID, HOURS + 1, timeout=720)
        tasks = {run.run_id: deployment.task_states(DAG_ID, run.run_id) for run in runs}
        downstream = deployment.wait_for_runs(DOWNSTREAM, HOURS, timeout=300)
        partition_keys = [row[0] for row in deployment._query(
            "SELECT partition_key FROM dag_run WHERE dag_id = :d ORDER BY partition_key", d=DOWNSTREAM)]
        out = {  # read while the deployment runs: a failure here must stop it too
            "target": target, "warehouse": warehouse, "table": table, "offsets": offsets, "runs": runs,
            "tasks": tasks, "rows": TARGETS[target](warehouse, table), "seconds": time.monotonic() - began,
            "audits": [json.loads(p.read_text()) for p in sorted((warehouse / "_audit").rglob("*.json"))
                       if p.name != "_logbus_complete_through.json"],
            "downstream": downstream, "partition_keys": partition_keys,
            "failed_logs": {(run_id, t.task_id): deployment.task_log(DAG_ID, run_id, t.task_id)[-4000:]
                            for run_id, states in tasks.items() for t in states.values() if t.state != "success"},
        }
    except BaseException:
        report_logs(request, deployment)
        deployment.stop()
        raise
    yield out
    if request.session.testsfailed > failed_before:
        report_logs(request, deployment)
    deployment.stop()


def test_backfill_and_scheduled_runs_all_succeed(scenario):
    runs = scenario["runs"]
    assert sorted(r.run_type for r in runs).count("backfill") == HOURS
    assert any(r.run_type == "scheduled" for r in runs)
    states = {r.run_id: (r.state, {t: (s.state, s.try_number) for t, s in scenario["tasks"][r.run_id].items()})
              for r in runs}
    assert all(r.state == "success" for r in runs), (states, scenario["failed_logs"])
    for run_id, tasks in scenario["tasks"].items():
        assert set(tasks) == {"wait_for_data", "snapshot", "load", "commit", "audit"}
        assert all(t.state == "success" for t in tasks.values()), (run_id, states[run_id])


def test_the_runs_overlapped(scenario):
    """The scenario's premise: runs loaded at the same time (snapshot start to commit end)."""
    spans = [(tasks["snapshot"].start_date, tasks["commit"].end_date) for tasks in scenario["tasks"].values()
             if tasks.get("snapshot") and tasks.get("commit") and tasks["commit"].end_date]
    runs = [(r.start_date, r.end_date) for r in scenario["runs"] if r.start_date and r.end_date]
    print(f"[{scenario['target']}] {len(scenario['runs'])} runs in {scenario['seconds']:.0f}s; at most "
          f"{max_overlap(runs)} runs active at once, {max_overlap(spans)} between snapshot and commit")
    assert max_overlap(spans) >= 2


def test_every_message_is_in_the_table_exactly_once(scenario):
    rows = collections.Counter(scenario["rows"])
    duplicated = {k: n for k, n in rows.items() if n > 1}
    assert not duplicated, (f"{sum(rows.values())} rows for {len(scenario['offsets'])} messages; "
                            f"{len(duplicated)} offsets loaded more than once, e.g. {sorted(duplicated.items())[:5]}")
    assert set(rows) == scenario["offsets"]
    assert len(scenario["offsets"]) == HOURS * EVENTS_PER_HOUR + 8


def test_audits_report_no_duplicates(scenario):
    audits = scenario["audits"]
    assert len(audits) >= HOURS + 1
    for report in audits:
        assert report["duplicated"] == 0, report
        assert report["missing"] == 0, report
    produced = sum(r["produced"] for r in audits)
    assert produced == HOURS * EVENTS_PER_HOUR


def test_each_complete_hour_triggers_the_downstream_dag_exactly_once(scenario):
    """Five audits, finishing in any order, announce the four loaded hours once each; the
    hour of the events stamped in the future is not complete and is never announced."""
    hours = [f"{FIRST_HOUR + timedelta(hours=h):%Y-%m-%dT%H:%MZ}" for h in range(HOURS)]
    assert scenario["partition_keys"] == hours
    assert all(r.state == "success" for r in scenario["downstream"])
