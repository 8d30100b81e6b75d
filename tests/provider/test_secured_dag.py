"""The example hourly DAG on a secured cluster (harness.secured: TLS, SCRAM, ACLs,
ZooKeeper ACLs), reached only through the Airflow connection: the loader's principal
may read its topic and nothing else. Its password never shows in spark-submit's
command line, the task logs or the lineage the load reports."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from broker.client.monitoring import MONITORING_TOPIC
from broker.common.acls import Operation, ResourceType
from harness.process import wait_until
from harness.secured import SecuredCluster

from airflow_provider_logbus.cluster import LogbusCluster

from .conftest import load_dag
from .helpers import all_offsets, process_output, produce, table_rows, yesterday_start

pytestmark = pytest.mark.slow
HOUR = 3_600_000
TOPIC = TABLE = "secured_web"
PASSWORD = "loader-password-4f1c"


class CommandLines(threading.Thread):
    """Every process command line seen while the DAG runs (spark-submit's included)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[bytes] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    self.seen.add(Path(f"/proc/{pid}/cmdline").read_bytes())
                except OSError:
                    pass
            time.sleep(0.05)


@pytest.fixture(scope="module")
def scenario(zookeeper, airflow_db, tmp_path_factory):
    from harness.zookeeper import ZooKeeperServer

    work = tmp_path_factory.mktemp("secured-dag")
    with ZooKeeperServer(work / "zookeeper") as zk_server:
        secured = SecuredCluster(work, zk_server, settings={"num.partitions": 2, "log.flush.interval.ms": 20})
        try:
            secured.start(2)
            secured.add_user("loader", PASSWORD)
            secured.add_user("web", "web-secret")
            for topic in (TOPIC, MONITORING_TOPIC):
                secured.allow("User:loader", Operation.READ, ResourceType.TOPIC, topic)
                secured.allow("User:web", Operation.WRITE, ResourceType.TOPIC, topic)
                secured.allow("User:web", Operation.CREATE, ResourceType.TOPIC, topic)
            yield run_scenario(secured, work)
        finally:
            secured.stop()


def run_scenario(secured: SecuredCluster, work: Path) -> dict:
    zk = secured.connect_string
    os.environ["AIRFLOW_CONN_LOGBUS_DEFAULT"] = json.dumps({
        "conn_type": "logbus", "login": "loader", "password": PASSWORD,
        "extra": {"zookeeper": zk, "security_protocol": "SASL_SSL", "listener": "CLIENT",
                  "ssl_ca_pem": secured.ca.cafile.read_text()},
    })
    warehouse = work / "warehouse"
    env = {"LOGBUS_TOPIC": TOPIC, "LOGBUS_TABLE": TABLE, "LOGBUS_WAREHOUSE": str(warehouse),
           "LOGBUS_GROUP": "loader", "LOGBUS_SENSOR_GRACE_MINUTES": "0", "LOGBUS_AUDIT_GRACE_MINUTES": "0",
           "LOGBUS_RETRY_DELAY_SECONDS": "0", "LOGBUS_VALUE_SCHEMA": "server string, n long, ts_ms long",
           "LOGBUS_ON_DATA_LOSS": "fail", "LOGBUS_TARGET": "directory", "LOGBUS_DAILY_AUDIT_GRACE_MINUTES": "0"}
    dag = load_dag("logbus_hourly_load.py", env)
    start = int(yesterday_start().timestamp() * 1000) + 10 * HOUR
    web = secured.scram("web", "web-secret")
    produce(zk, TOPIC, [start + i * (HOUR // 60) for i in range(60)] + [start + HOUR + 1000 * i for i in range(1, 9)],
            security=web)
    loader = secured.scram("loader", PASSWORD)
    with LogbusCluster(zk, security=loader) as cluster:
        wait_until(lambda: all(cluster.has_data_after(TOPIC, p, start + HOUR) for p in cluster.partitions(TOPIC)),
                   30, "tail data")
    commands = CommandLines()
    commands.start()
    output = work / "output.log"
    try:
        with process_output(output):
            run = dag.test(logical_date=datetime.fromtimestamp((start + HOUR) / 1000, timezone.utc))
    finally:
        commands.stop.set()
        commands.join()
    logs = output.read_text(errors="replace") + "".join(
        p.read_text(errors="replace") for p in Path(os.environ["AIRFLOW_HOME"]).rglob("*.log")
        if p.stat().st_mtime > time.time() - 600)
    return {"run": run, "rows": table_rows(warehouse / TABLE), "offsets": all_offsets(zk, TOPIC, loader),
            "commands": commands.seen, "logs": logs, "secured": secured,
            "reports": [json.loads(p.read_text()) for p in sorted((warehouse / "_audit" / TABLE).glob("*.json"))]}


def test_the_hourly_dag_loads_every_message_once_through_the_connection(scenario):
    assert str(scenario["run"].state) == "success"
    loaded = [(r["partition"], r["offset"]) for r in scenario["rows"]]
    assert len(loaded) == len(set(loaded)) == 60 + 8
    assert set(loaded) == scenario["offsets"]


def test_the_audit_of_the_secured_hour_is_complete(scenario):
    assert scenario["reports"], "the hourly audit kept its report"
    for report in scenario["reports"]:
        assert report["status"] == "ok" and report["completeness"] == 1.0, report
        assert report["missing"] == 0 and report["duplicated"] == 0


def test_the_password_appears_in_no_command_line_and_no_log(scenario):
    assert any(b"SparkSubmit" in c for c in scenario["commands"]), "spark-submit was never seen"
    assert not [c for c in scenario["commands"] if PASSWORD.encode() in c]
    assert PASSWORD not in scenario["logs"]
    assert "load_job.py" in scenario["logs"], "no task log was read"


def test_the_loader_was_held_to_its_acls(scenario):
    """It could read its topic; writing to it is refused, by every broker."""
    from broker.client.connection import BrokerConnection
    from broker.common.errors import TopicAuthorizationFailed
    from broker.common.message import encode_message_set

    secured = scenario["secured"]
    for broker_id in (0, 1):
        with BrokerConnection(*secured.address(broker_id, "CLIENT"), security=secured.scram("loader", PASSWORD)) as c:
            with pytest.raises(TopicAuthorizationFailed):
                c.produce(TOPIC, 0, encode_message_set([(None, b"x", 1)]), acks=1)
