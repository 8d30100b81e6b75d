"""The Spark load as production sees it: a leader broker down for less than the load's
`leader_wait` is waited for, one down for longer fails the load naming its cause (the
job's own exception and the Spark log), and embedded Spark — like the ZooKeeper and
brokers the tests start — listens on loopback only. Real ZooKeeper, brokers and
spark-submit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_provider_logbus.batch import plan_batch
from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.hooks.logbus import LogbusHook
from airflow_provider_logbus.operators.spark_load import LogbusLoadError, LogbusSparkLoadOperator
from airflow_provider_logbus.spark.failure import ERROR_FILE, SPARK_LOG
from airflow_provider_logbus.targets.directory import DirectoryTarget
from harness.process import wait_until
from harness.sockets import listeners

from .helpers import FakeTaskInstance, fill_last_hour

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HOUR = 3_600_000
TOPIC = TABLE = "clicks"
SCHEMA = "server string, n long, ts_ms long"
# the load task in a process of its own, so that its output (spark-submit's, executors'
# included) can be read line by line while it runs
RUN_LOAD = """
import json, sys
from airflow_provider_logbus.operators.spark_load import LogbusSparkLoadOperator
from tests.provider.helpers import FakeTaskInstance
args = json.loads(sys.argv[1])
result = LogbusSparkLoadOperator(task_id="load", **args["operator"]).execute(
    {"ti": FakeTaskInstance({"snapshot": args["plan"]})})
print("LOAD RESULT " + json.dumps(result), flush=True)
"""


@pytest.fixture
def loadable(cluster, airflow_db, tmp_path):
    """Two brokers, a topic with data on both partitions, and the batch's snapshot."""
    zk, start = fill_last_hour(cluster, TOPIC, 40)
    with LogbusCluster(zk) as c:
        leaders = c.leaders(TOPIC)
    warehouse = tmp_path / "warehouse"
    hook = LogbusHook()
    try:
        interval_start = datetime.fromtimestamp(start / 1000, timezone.utc)
        plan = plan_batch(hook.get_conn(), DirectoryTarget(warehouse, TABLE), TOPIC, interval_start,
                          interval_start + timedelta(hours=1)).to_dict()  # the snapshot task's XCom
    finally:
        hook.close()
    operator = LogbusSparkLoadOperator(task_id="load", table=TABLE, warehouse=str(warehouse), schema=SCHEMA)
    return {"cluster": cluster, "operator": operator, "plan": plan, "leaders": leaders, "zk": zk,
            "warehouse": warehouse}


def stop_broker(loadable, broker_id: int) -> int:
    """Stop a broker and wait until ZooKeeper no longer lists it; a partition it led (alone: RF 1)."""
    loadable["cluster"].brokers[broker_id].stop()
    with LogbusCluster(loadable["zk"]) as c:
        wait_until(lambda: broker_id not in c.brokers(), 30, f"broker {broker_id} deregistered")
    return next(p for p, leader in loadable["leaders"].items() if leader == broker_id)


class LoadProcess:
    """The load task run once (one try) in a child process; its output is collected line
    by line while it runs. Killed with its spark-submit if the test ends first."""

    def __init__(self, loadable, **operator_args) -> None:
        args = {"plan": loadable["plan"], "operator": {"table": TABLE, "warehouse": str(loadable["warehouse"]),
                                                       "schema": SCHEMA, **operator_args}}
        self.lines: list[str] = []
        self.process = subprocess.Popen([sys.executable, "-c", RUN_LOAD, json.dumps(args)], cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self.reader.start()

    def saw(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def result(self, timeout: float) -> dict:
        code = self.process.wait(timeout)
        self.reader.join(10)
        output = "".join(self.lines)
        assert code == 0, output[-5000:]
        return json.loads(output.rsplit("LOAD RESULT ", 1)[1])

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


class ListeningSockets:
    """Every listening socket seen, sampled every 100 ms while the block runs."""

    def __init__(self) -> None:
        self.seen: list = []
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.is_set():
            self.seen.extend(listeners())
            time.sleep(0.1)

    def __enter__(self) -> "ListeningSockets":
        self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._sampler.join(10)


def test_a_load_waits_for_a_leader_down_less_than_its_leader_wait_succeeds_and_listens_on_loopback_only(loadable):
    """One load serves both checks (a spark-submit is a minute of a CI worker): it waits
    for the leader and succeeds on its first try, and while it runs embedded Spark, like
    the ZooKeeper and brokers the tests start, listens on loopback only."""
    partition = stop_broker(loadable, 1)
    with ListeningSockets() as sockets:
        load = LoadProcess(loadable, leader_wait=30)
        try:
            # the executor says which partition it waits for (in spark-submit's output);
            # only then does the leader come back
            wait_until(lambda: load.saw(f"waiting up to 30s for a leader of {TOPIC}-{partition}")
                       or load.process.poll() is not None, 240, "the load to wait for the leader")
            loadable["cluster"].start_broker(1)
            result = load.result(timeout=240)
        finally:
            load.kill()
    counts = json.loads(Path(result["staging"], "_logbus_counts.json").read_text())
    assert counts["row_count"] == 40 and result["staging"].endswith(".1")  # every message, on the first try

    seen = sockets.seen
    assert {(l.address, l.port) for l in seen if "SparkSubmit" in l.command}, \
        "no listening socket of the Spark driver was seen during the load"
    assert any("ZooKeeperServerMain" in l.command for l in seen) and any("logbus-broker" in l.command for l in seen)
    exposed = sorted({(l.address, l.port, l.command[:80]) for l in seen if not l.loopback})
    assert not exposed, exposed


def test_a_load_whose_leader_stays_down_past_its_leader_wait_fails_naming_the_partition(loadable):
    partition = stop_broker(loadable, 1)
    loadable["operator"].leader_wait = 3
    with pytest.raises(LogbusLoadError) as failed:
        loadable["operator"].execute({"ti": FakeTaskInstance({"snapshot": loadable["plan"]})})
    message = str(failed.value)
    assert message.startswith(f"ConnectionError: no leader of {TOPIC}-{partition} reachable within leader_wait 3s: "
                              f"leader broker 1 of {TOPIC}-{partition} is not live"), message
    assert "Cannot execute" not in message and "--ranges" not in message
    log = Path(message.rsplit("(Spark log: ", 1)[1].rstrip(")"))
    assert log.name == SPARK_LOG and "ConnectionError" in log.read_text()  # spark-submit's output
    assert (log.parent / ERROR_FILE).exists()
