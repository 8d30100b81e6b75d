"""The example hourly DAG end to end: real ZooKeeper and brokers, real Airflow
(`dag.test()` on SQLite), Spark through spark-submit.

One scenario for the module (Spark start-up is slow on 2 cores), on yesterday's hours so
that the example daily audit can check the whole day: interval 1 runs with its load
task's spark-submit killed on the first try; interval 2 runs normally; then interval 2 is
cleared and run again. Each test checks one behaviour of that scenario; the last ones run
the daily audit over that day, then again once an hour of it holds messages no load took.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pytest


from airflow_provider_logbus.cluster import LogbusCluster
from harness.process import wait_until

from .conftest import load_dag, use_logbus_connection
from .helpers import all_offsets, produce, produce_unloaded, run_daily_audit, table_rows, yesterday_start

pytestmark = pytest.mark.slow
HOUR = 3_600_000
TOPIC = TABLE = "web"
SCHEMA = "server string, n long, ts_ms long"


def find_load_job(staging_marker: str) -> int | None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"SparkSubmit" in a for a in cmdline) and any(staging_marker.encode() in a for a in cmdline):
            return int(pid)
    return None


class KillFirstLoad(threading.Thread):
    """Fault injection with a real failure: SIGKILL the first attempt's spark-submit
    once Spark has started writing its staging directory (`written`: whether it has;
    by default whether the local directory exists)."""

    def __init__(self, staging: Path | str, written: Callable[[], bool] | None = None) -> None:
        super().__init__(daemon=True)
        self.staging, self.killed, self.stop = staging, False, threading.Event()
        self.written = written or Path(staging).exists

    def run(self) -> None:
        while not self.stop.is_set():
            pid = find_load_job(str(self.staging))
            if pid and self.written():
                os.kill(pid, signal.SIGKILL)
                self.killed = True
                return
            time.sleep(0.05)


def task_states(dr) -> dict[str, tuple[str, int]]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter(TaskInstance.dag_id == dr.dag_id, TaskInstance.run_id == dr.run_id)
        return {ti.task_id: (str(ti.state), ti.try_number) for ti in tis}


@pytest.fixture(scope="module")
def scenario(module_cluster, airflow_db, tmp_path_factory):
    zk = module_cluster.zookeeper
    use_logbus_connection(zk)
    warehouse = tmp_path_factory.mktemp("warehouse")
    env = {"LOGBUS_TOPIC": TOPIC, "LOGBUS_TABLE": TABLE, "LOGBUS_WAREHOUSE": str(warehouse),
           "LOGBUS_GROUP": "loader", "LOGBUS_SENSOR_GRACE_MINUTES": "0", "LOGBUS_AUDIT_GRACE_MINUTES": "0",
           "LOGBUS_RETRY_DELAY_SECONDS": "0", "LOGBUS_VALUE_SCHEMA": SCHEMA, "LOGBUS_ON_DATA_LOSS": "fail",
           "LOGBUS_TARGET": "directory", "LOGBUS_DAILY_AUDIT_GRACE_MINUTES": "0"}
    dag = load_dag("logbus_hourly_load.py", env)
    day = yesterday_start()
    h0 = int(day.timestamp() * 1000) + 10 * HOUR
    ends = [h0 + HOUR, h0 + 2 * HOUR]

    def produce_interval(start: int, n: int) -> None:
        # n events in the hour, then a few in the next hour's first minute so that every
        # partition shows the hour is complete (the sensor's condition)
        produce(zk, TOPIC, [start + i * (HOUR // n) for i in range(n)] + [start + HOUR + 1000 * i for i in range(1, 9)])

    out = {"warehouse": warehouse, "ends": ends, "dag": dag, "zk": zk, "env": env, "day": day}
    produce_interval(h0, 120)
    with LogbusCluster(zk) as c:
        wait_until(lambda: all(c.has_data_after(TOPIC, p, ends[0]) for p in c.partitions(TOPIC)), 30, "tail data")
    out["offsets_1"] = all_offsets(zk, TOPIC)
    batch1 = f"{datetime.fromtimestamp(h0 / 1000, timezone.utc):%Y%m%dT%H%M%S}"
    killer = KillFirstLoad(warehouse / TABLE / "_staging" / f"{batch1}_{datetime.fromtimestamp(ends[0] / 1000, timezone.utc):%Y%m%dT%H%M%S}.1")
    killer.start()
    try:
        out["dr1"] = dag.test(logical_date=datetime.fromtimestamp(ends[0] / 1000, timezone.utc))
    finally:
        killer.stop.set()
    out["killed"] = killer.killed
    out["states_1"] = task_states(out["dr1"])
    out["rows_after_1"] = table_rows(warehouse / TABLE)

    produce_interval(ends[0], 90)
    with LogbusCluster(zk) as c:
        wait_until(lambda: all(c.has_data_after(TOPIC, p, ends[1]) for p in c.partitions(TOPIC)), 30, "tail data")
    out["offsets_2"] = all_offsets(zk, TOPIC)
    out["dr2"] = dag.test(logical_date=datetime.fromtimestamp(ends[1] / 1000, timezone.utc))
    out["rows_after_2"] = table_rows(warehouse / TABLE)
    out["batches_after_2"] = sorted(p.name for p in (warehouse / TABLE).glob("batch_id=*"))
    out["records_after_2"] = {p.name: json.loads((p / "_logbus_batch.json").read_text())
                              for p in (warehouse / TABLE).glob("batch_id=*")}
    # a cleared and re-run DAG run: dag.test clears the run's task instances and runs them again
    out["dr2_again"] = dag.test(logical_date=datetime.fromtimestamp(ends[1] / 1000, timezone.utc))
    out["states_2_again"] = task_states(out["dr2_again"])
    out["rows_after_rerun"] = table_rows(warehouse / TABLE)
    out["reports"] = [json.loads(p.read_text()) for p in sorted((warehouse / "_audit" / TABLE).glob("*.json"))]
    return out


def test_first_interval_run_succeeds_after_a_killed_load(scenario):
    assert scenario["killed"], "the first spark-submit was never seen"
    assert str(scenario["dr1"].state) == "success", scenario["states_1"]
    state, tries = scenario["states_1"]["load"]
    assert state == "success" and tries == 2


def test_two_intervals_load_every_produced_message_exactly_once(scenario):
    assert str(scenario["dr2"].state) == "success"
    rows = scenario["rows_after_2"]
    loaded = [(r["partition"], r["offset"]) for r in rows]
    assert len(loaded) == len(set(loaded))  # no duplicates
    assert set(loaded) == scenario["offsets_2"]  # nothing missing, nothing extra
    assert len(loaded) == 120 + 8 + 90 + 8


def test_first_batch_holds_exactly_what_was_there_at_its_snapshot(scenario):
    loaded = {(r["partition"], r["offset"]) for r in scenario["rows_after_1"]}
    assert loaded == scenario["offsets_1"] and len(scenario["rows_after_1"]) == len(loaded)


def test_second_batch_starts_where_the_first_ended(scenario):
    first, second = (scenario["records_after_2"][name] for name in scenario["batches_after_2"])
    ends = {r["partition"]: r["end"] for r in first["ranges"]}
    starts = {r["partition"]: r["start"] for r in second["ranges"]}
    assert starts == ends and any(r["end"] > r["start"] for r in second["ranges"])
    assert first["row_count"] + second["row_count"] == len(scenario["rows_after_2"])


def test_killed_attempt_leaves_no_staging_and_the_retry_is_published(scenario):
    staging = scenario["warehouse"] / TABLE / "_staging"
    assert not any(staging.iterdir()) if staging.exists() else True
    first = scenario["records_after_2"][scenario["batches_after_2"][0]]
    assert first["attempt"].endswith(".2")


def test_rerun_of_a_committed_interval_duplicates_nothing(scenario):
    assert str(scenario["dr2_again"].state) == "success", scenario["states_2_again"]
    before = sorted((r["partition"], r["offset"]) for r in scenario["rows_after_2"])
    after = sorted((r["partition"], r["offset"]) for r in scenario["rows_after_rerun"])
    assert after == before


def test_group_offsets_mirror_the_last_committed_batch(scenario):
    with LogbusCluster(scenario["zk"]) as c:
        mirrored = c.group_offsets("loader", TOPIC)
    last = scenario["records_after_2"][scenario["batches_after_2"][-1]]
    assert mirrored == {r["partition"]: r["end"] for r in last["ranges"]}


def test_audit_task_of_each_run_finds_nothing_missing(scenario):
    reports = scenario["reports"]
    assert len(reports) == 2
    for report in reports:
        assert report["produced"] > 0
        assert report["missing"] == 0 and report["duplicated"] == 0 and report["status"] == "ok"
    assert [r["produced"] for r in reports] == [120, 8 + 90]


@pytest.fixture(scope="module")
def daily_audits(scenario) -> dict:
    """The example daily audit over the day the hourly DAG loaded, then over the same day
    once 20 messages stamped 15:00-15:20 — an hour no load ran for — were produced."""
    out = {"complete": run_daily_audit(scenario["env"], scenario["day"])}
    hour = int(scenario["day"].timestamp() * 1000) + 15 * HOUR
    produce_unloaded(scenario["zk"], TOPIC, [hour + i * 60_000 for i in range(20)])
    out["hour_missing"] = run_daily_audit(scenario["env"], scenario["day"])
    return out


def test_the_daily_audit_passes_a_day_the_hourly_dag_loaded(daily_audits):
    state, report = daily_audits["complete"]
    assert state == "success", report
    assert report["status"] == "ok" and report["missing"] == 0 and report["duplicated"] == 0
    assert report["produced"] == report["loaded"] == 120 + 8 + 90 + 8


def test_the_daily_audit_fails_a_day_with_an_hour_missing(daily_audits):
    state, report = daily_audits["hour_missing"]
    assert state == "failed" and report["status"] == "failed"
    missing = {h["hour"][-6:]: h["missing"] for h in report["hours"] if h["missing"]}
    assert missing == {"15:00Z": 20}
