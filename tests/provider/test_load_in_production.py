"""The Spark load as production sees it: a failed load names its cause (the job's own
exception and the Spark log), and embedded Spark — like the ZooKeeper and brokers the
tests start — listens on loopback only. Real ZooKeeper, brokers and spark-submit."""

from __future__ import annotations

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
HOUR = 3_600_000
TOPIC = TABLE = "clicks"


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
    operator = LogbusSparkLoadOperator(task_id="load", table=TABLE, warehouse=str(warehouse),
                                       schema="server string, n long, ts_ms long")
    return {"cluster": cluster, "operator": operator, "plan": plan, "leaders": leaders, "zk": zk}


def test_a_load_whose_leader_is_down_fails_naming_the_partition_and_the_broker(loadable):
    partition = next(p for p, leader in loadable["leaders"].items() if leader == 1)
    loadable["cluster"].brokers[1].stop()
    with LogbusCluster(loadable["zk"]) as c:
        wait_until(lambda: 1 not in c.brokers(), 30, "broker 1 deregistered")
    with pytest.raises(LogbusLoadError) as failed:
        loadable["operator"].execute({"ti": FakeTaskInstance({"snapshot": loadable["plan"]})})
    message = str(failed.value)
    assert message.startswith(f"ConnectionError: leader broker 1 of {TOPIC}-{partition} is not live"), message
    assert "Cannot execute" not in message and "--ranges" not in message
    log = Path(message.rsplit("(Spark log: ", 1)[1].rstrip(")"))
    assert log.name == SPARK_LOG and "ConnectionError" in log.read_text()  # spark-submit's output
    assert (log.parent / ERROR_FILE).exists()


def test_embedded_spark_zookeeper_and_brokers_listen_on_loopback_only(loadable):
    seen, done = [], threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.extend(listeners())
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = loadable["operator"].execute({"ti": FakeTaskInstance({"snapshot": loadable["plan"]})})
    finally:
        done.set()
        sampler.join(10)
    assert result["staging"] and Path(result["staging"], "_logbus_counts.json").exists()
    spark = {(l.address, l.port) for l in seen if "SparkSubmit" in l.command}
    assert spark, "no listening socket of the Spark driver was seen during the load"
    assert any("ZooKeeperServerMain" in l.command for l in seen) and any("logbus-broker" in l.command for l in seen)
    exposed = sorted({(l.address, l.port, l.command[:80]) for l in seen if not l.loopback})
    assert not exposed, exposed
