"""The load job on a Spark standalone cluster: a master and a worker from the pip
pyspark's own launcher, `spark_default` pointing at `spark://127.0.0.1:<port>`, the
operators driven as an Airflow run drives them (snapshot, load, commit), without the
scheduler. Real ZooKeeper, brokers, spark-submit, master, worker and executor.

Where the data source read is proven from Spark's event log: the stage that scanned the
`logbus` source ran its tasks on the executor the worker launched (its log URLs point at
the worker's web UI) and read exactly the batch's messages there; the executor's own
log in the worker's work directory shows that stage's Python tasks."""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_provider_logbus.batch import plan_batch
from airflow_provider_logbus.hooks.logbus import LogbusHook
from airflow_provider_logbus.operators.commit import LogbusCommitOperator
from airflow_provider_logbus.operators.spark_load import LogbusSparkLoadOperator
from airflow_provider_logbus.targets.directory import DirectoryTarget
from harness.sockets import Listener, listeners
from harness.spark import SparkStandalone

from .conftest import ROOT
from .helpers import all_offsets, fill_last_hour, table_rows

pytestmark = [pytest.mark.slow, pytest.mark.long]  # a master and a worker: two minutes of one worker
HOUR = 3_600_000
TOPIC = TABLE = "views"
MESSAGES = 40
SOURCE_SCAN = "BatchScan logbus"  # the scope Spark names the data source's scan with


@pytest.fixture
def standalone(tmp_path, monkeypatch):
    """A master and one worker; `spark_default` points at the master. The worker gives
    its executors the venv's Python and the provider importable (PYTHONPATH: this
    checkout, standing in for the provider's package installed on the worker machine)."""
    env = {"PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    with SparkStandalone(tmp_path / "spark", env=env) as spark:
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", spark.master_url)
        yield spark


class TaskInstance:
    """What the operators read from Airflow's task instance: the XComs of the tasks
    before them, and the try number."""

    def __init__(self, xcoms: dict[str, dict], try_number: int = 1) -> None:
        self.xcoms, self.try_number = xcoms, try_number

    def xcom_pull(self, task_ids: str) -> dict | None:
        return self.xcoms.get(task_ids)


class Listening(threading.Thread):
    """Samples the listening sockets of this process's tree (brokers, ZooKeeper, the
    Spark daemons, spark-submit and the executor) until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[Listener] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.seen |= set(listeners())
            time.sleep(0.2)

    def stop(self) -> None:
        self.done.set()
        self.join(10)


def snapshot(hook: LogbusHook, warehouse: Path, start_ms: int) -> dict:
    """The snapshot task's XCom: the batch plan of the hour starting at `start_ms`."""
    interval_start = datetime.fromtimestamp(start_ms / 1000, timezone.utc)
    target = DirectoryTarget(warehouse, TABLE)
    plan = plan_batch(hook.get_conn(), target, TOPIC, interval_start, interval_start + timedelta(hours=1))
    return {**plan.to_dict(), "warehouse": str(warehouse)}


def source_scan(event_log: Path) -> tuple[dict[str, str], list[dict]]:
    """From a Spark event log: each executor's stderr log URL ("" for a local master's
    driver), and the tasks (stage, executor, records read) of the first stage that
    scanned the logbus source (later ones read the job's cached copy)."""
    events = [json.loads(line) for line in event_log.read_text().splitlines()]
    executors = {e["Executor ID"]: e["Executor Info"].get("Log Urls", {}).get("stderr", "")
                 for e in events if e["Event"] == "SparkListenerExecutorAdded"}
    scans = sorted(e["Stage Info"]["Stage ID"] for e in events if e["Event"] == "SparkListenerStageCompleted"
                   and any(r["Name"] == "DataSourceRDD" and SOURCE_SCAN in r.get("Scope", "")
                           for r in e["Stage Info"]["RDD Info"]))
    assert scans, f"no stage scanned the logbus source in {event_log}"
    tasks = [{"stage": e["Stage ID"], "executor": e["Task Info"]["Executor ID"],
              "records": e["Task Metrics"]["Input Metrics"]["Records Read"]}
             for e in events if e["Event"] == "SparkListenerTaskEnd" and e["Stage ID"] == scans[0]]
    return executors, tasks


def test_a_standalone_worker_loads_a_batch_exactly_once(cluster, airflow_db, standalone, tmp_path):
    zk, start = fill_last_hour(cluster, TOPIC, MESSAGES)
    produced = all_offsets(zk, TOPIC)
    warehouse, events = tmp_path / "warehouse", tmp_path / "events"
    events.mkdir()
    hook = LogbusHook()
    try:
        plan = snapshot(hook, warehouse, start)
        # the driver must be reachable by the executors; here they share the machine
        conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                "spark.ui.enabled": "false", "spark.eventLog.enabled": "true", "spark.eventLog.dir": str(events),
                "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}
        load = LogbusSparkLoadOperator(task_id="load", table=TABLE, warehouse=str(warehouse),
                                       schema="server string, n long, ts_ms long", conf=conf)
        commit = LogbusCommitOperator(task_id="commit", table=TABLE, warehouse=str(warehouse))
        listening = Listening()
        listening.start()
        try:
            loaded = load.execute({"ti": TaskInstance({"snapshot": plan})})
        finally:
            listening.stop()
        committed = commit.execute({"ti": TaskInstance({"snapshot": plan, "load": loaded}), "run_id": "run-1"})
        rows_after_load = table_rows(warehouse / TABLE)
        # the commit retried after its publish, then the interval run again from its snapshot
        retried = commit.execute({"ti": TaskInstance({"snapshot": plan, "load": loaded}, 2), "run_id": "run-1"})
        again = snapshot(hook, warehouse, start)
        skipped = load.execute({"ti": TaskInstance({"snapshot": again})})
        rerun = commit.execute({"ti": TaskInstance({"snapshot": again, "load": skipped}), "run_id": "run-2"})
    finally:
        hook.close()

    loaded_offsets = [(r["partition"], r["offset"]) for r in rows_after_load]
    assert len(loaded_offsets) == len(set(loaded_offsets)) == MESSAGES and set(loaded_offsets) == produced
    assert committed["published_now"] and committed["row_count"] == MESSAGES
    assert not retried["published_now"] and again["committed"] and skipped["staging"] is None
    assert not rerun["published_now"]
    assert sorted((r["partition"], r["offset"]) for r in table_rows(warehouse / TABLE)) == sorted(loaded_offsets)

    # the data source read the batch on the worker's executor, not in the driver
    (event_log,) = events.iterdir()
    executors, tasks = source_scan(event_log)
    worker_ui = f"http://127.0.0.1:{standalone.worker_webui_port}/"
    assert executors and all(url.startswith(worker_ui) for url in executors.values()), executors
    assert tasks and all(t["executor"] in executors for t in tasks), tasks
    assert sum(t["records"] for t in tasks) == MESSAGES
    executor_log = "".join(p.read_text(errors="replace") for p in standalone.executor_logs())
    assert f"Starting Python task execution - task 0.0 in stage {tasks[0]['stage']} " in executor_log

    # nothing listened outside loopback: master, worker, executor, driver, brokers, ZooKeeper
    exposed = sorted({(l.address, l.port, l.command[:100]) for l in listening.seen if not l.loopback})
    assert not exposed, exposed
    commands = " ".join(l.command for l in listening.seen)
    for process in ("deploy.master.Master", "deploy.worker.Worker", "CoarseGrainedExecutorBackend", "SparkSubmit"):
        assert process in commands, f"no listening socket of {process} was seen during the load"
