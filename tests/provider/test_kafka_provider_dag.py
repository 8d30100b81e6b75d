"""Airflow's Kafka provider against logbus (issue 36): the example DAG
`logbus_kafka_clients` — its ProduceToTopicOperator, ConsumeFromTopicOperator (a
consumer group) and AwaitMessageSensor (deferred; dag.test runs its trigger) — run
with `dag.test()` against a broker's Kafka listener. The records are logbus data (read
back by the native reader) and the consumer group's commit is where logbus's lag
tools read it (ZooKeeper)."""

from __future__ import annotations

import json
import os

import pytest
from kazoo.client import KazooClient

from broker.common.zklayout import decode_offset, offset_path
from harness.cluster import LocalCluster
from tests.integration.brokerutil import connect, read_partition

from .conftest import load_dag, new_chroot

pytestmark = pytest.mark.long  # a DAG run under dag.test(): about a minute of one worker
TOPIC = "kafka_clients_example"
EVENTS = 30


def test_the_kafka_providers_operators_and_sensor_run_against_logbus(zookeeper, tmp_path, airflow_db):
    connect_string = new_chroot(zookeeper)
    with LocalCluster(connect_string, tmp_path, settings={"log.flush.interval.ms": 20}) as cluster:
        broker = cluster.start_broker(0, kafka=True)
        base = {"bootstrap.servers": broker.kafka_bootstrap, "auto.offset.reset": "earliest"}
        os.environ["AIRFLOW_CONN_LOGBUS_KAFKA"] = json.dumps({"conn_type": "kafka", "extra": {
            **base, "group.id": "example-consume", "enable.idempotence": True}})
        os.environ["AIRFLOW_CONN_LOGBUS_KAFKA_WATCH"] = json.dumps({"conn_type": "kafka", "extra": {
            **base, "group.id": "example-watch"}})
        dag = load_dag("logbus_kafka_clients.py", {"LOGBUS_KAFKA_EXAMPLE_EVENTS": str(EVENTS)})
        run = dag.test()
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert states == {"produce": "success", "consume": "success", "wait_for_done": "success"}, states

        stored = read_partition(connect(broker), TOPIC, 0)
        assert len(stored) == EVENTS + 1 and stored[-1].key == b"marker"
        zk = KazooClient(connect_string)
        zk.start(30)
        try:
            committed = decode_offset(zk.get(offset_path("example-consume", TOPIC, 0))[0])
        finally:
            zk.stop()
            zk.close()
        assert committed == stored[-1].offset + 1  # Kafka's commit: the next record to read
