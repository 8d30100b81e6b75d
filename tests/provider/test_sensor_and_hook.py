"""The lag sensor in deferrable mode with its trigger run for real, the trigger's
serialization, and the hook's errors for missing or wrong connections."""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import datetime, timedelta, timezone

import pytest

from broker.common.zklayout import offset_path

from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.hooks.logbus import LogbusConnectionError, LogbusHook
from airflow_provider_logbus.sensors.lag import LogbusLagSensor
from airflow_provider_logbus.triggers.lag import LogbusLagTrigger
from harness.process import wait_until

from tests.integration.clientutil import read_topic

from .conftest import use_logbus_connection
from .helpers import produce

HOUR = 3_600_000


def run_trigger(trigger: LogbusLagTrigger) -> dict:
    async def first_event():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(first_event(), 60))


def test_trigger_serialize_round_trips():
    trigger = LogbusLagTrigger(topic="t", zookeeper="h:2181/c", group="g", min_lag=10, complete_after_ms=5,
                               poll_interval=0.5, timeout=30)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_logbus.triggers.lag.LogbusLagTrigger"
    json.dumps(kwargs)  # the triggerer stores it as JSON
    from airflow.sdk._shared.module_loading import import_string

    again = import_string(classpath)(**kwargs)
    assert again.serialize() == (classpath, kwargs)


def test_deferrable_sensor_succeeds_when_every_partition_passes_the_interval_end(cluster, airflow_db):
    from airflow.providers.common.compat.sdk import TaskDeferred

    cluster.start_broker(0, {"num.partitions": 2})
    cluster.start_broker(1, {"num.partitions": 2})
    zk = cluster.zookeeper
    use_logbus_connection(zk)
    now = int(time.time() * 1000)
    interval_end = now - now % HOUR - HOUR
    produce(zk, "pages", [interval_end - 60_000 + i * 1000 for i in range(40)])  # all inside the interval
    sensor = LogbusLagSensor(task_id="wait", topic="pages", deferrable=True, grace=timedelta(minutes=1),
                             poke_interval=0.2, timeout=20)
    context = {"data_interval_end": datetime.fromtimestamp(interval_end / 1000, timezone.utc)}
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, LogbusLagTrigger) and trigger.complete_after_ms == interval_end + 60_000

    # nothing stamped after the interval end + grace yet: the trigger keeps waiting, then times out
    trigger.timeout = 1.0
    assert run_trigger(trigger)["status"] == "timeout"

    produce(zk, "pages", [interval_end + 120_000 + i for i in range(40)])  # later data, on both partitions
    with LogbusCluster(zk) as c:
        wait_until(lambda: all(c.has_data_after("pages", p, interval_end + 60_000) for p in c.partitions("pages")),
                   30, "later data flushed on every partition")
    trigger.timeout = 20
    event = run_trigger(trigger)
    assert event["status"] == "success" and event["partitions_without_later_data"] == []
    assert sensor.execute_complete(context, event)["status"] == "success"


def test_trigger_succeeds_when_the_group_lag_reaches_the_threshold_in_records(cluster, zk):
    """`min_lag` counts records (offsets are not dense: docs/architecture.md, "Offsets"):
    10 records in producer batches are a lag of 10 — not their bytes, not their entries."""
    cluster.start_broker(0, {"num.partitions": 1})
    connect = cluster.zookeeper
    produce(connect, "lagged", [int(time.time() * 1000)] * 10, servers=1, one_entry_each=False)
    with LogbusCluster(connect) as c:
        end = wait_until(lambda: (e := c.latest("lagged", 0)) and len(read_topic(connect, "lagged")[0]) == 10 and e,
                         30, "flush")
        c.set_group_offsets("g", "lagged", {0: end})  # caught up: no lag
    trigger = LogbusLagTrigger(topic="lagged", zookeeper=connect, group="g", min_lag=10, poll_interval=0.1, timeout=1)
    assert run_trigger(trigger)["status"] == "timeout"
    zk.set(offset_path("g", "lagged", 0), b"0")  # the group falls back to the start: lag = every record
    trigger.min_lag = 11
    assert run_trigger(trigger)["status"] == "timeout", f"a lag of {end} bytes is 10 records, below 11"
    trigger.min_lag, trigger.timeout = 10, 20
    event = run_trigger(trigger)
    assert event["status"] == "success" and event["lag"] == {"0": 10} and "10 >= 10 records" in event["reason"]


def test_hook_with_a_missing_connection_names_it(airflow_db):
    os.environ.pop("AIRFLOW_CONN_LOGBUS_NOWHERE", None)
    with pytest.raises(LogbusConnectionError, match="'logbus_nowhere' is not defined"):
        LogbusHook("logbus_nowhere").get_conn()
    ok, message = LogbusHook("logbus_nowhere").test_connection()
    assert not ok and "logbus_nowhere" in message


def test_hook_with_a_connection_of_another_type_says_so(airflow_db, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LOGBUS_HTTP", json.dumps({"conn_type": "http", "host": "example.com"}))
    with pytest.raises(LogbusConnectionError, match="'logbus_http' has type 'http', expected 'logbus'"):
        LogbusHook("logbus_http").get_conn()


def test_hook_with_a_connection_without_cluster_address_says_what_to_set(airflow_db, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LOGBUS_EMPTY", json.dumps({"conn_type": "logbus"}))
    with pytest.raises(LogbusConnectionError, match="'logbus_empty' names no cluster"):
        LogbusHook("logbus_empty").get_conn()


def test_hook_test_connection_reports_an_unreachable_zookeeper(airflow_db, monkeypatch):
    from harness.process import free_port

    monkeypatch.setenv("AIRFLOW_CONN_LOGBUS_DOWN", json.dumps(
        {"conn_type": "logbus", "extra": {"zookeeper": f"127.0.0.1:{free_port()}", "timeout": 1}}))
    ok, message = LogbusHook("logbus_down").test_connection()
    assert not ok and "cannot connect to ZooKeeper" in message


def test_hook_builds_a_cluster_that_reads_offsets_group_offsets_and_lag(cluster):
    cluster.start_broker(0, {"num.partitions": 2})
    connect = cluster.zookeeper
    produce(connect, "facts", [int(time.time() * 1000)] * 30)
    hook = LogbusHook(zookeeper=connect)
    try:
        c = hook.get_conn()
        offsets = wait_until(lambda: (o := c.partition_offsets("facts")) and sum(x.latest for x in o.values()) > 0
                             and o, 30, "flush")
        assert sorted(offsets) == [0, 1] and all(o.earliest == 0 for o in offsets.values())
        c.set_group_offsets("g", "facts", {0: offsets[0].latest})
        assert c.group_offsets("g", "facts") == {0: offsets[0].latest}
        assert c.lag("g", "facts") == {0: 0, 1: len(read_topic(connect, "facts")[1])}  # records, not bytes
        assert hook.test_connection()[0]
    finally:
        hook.close()


def test_reading_a_range_whose_end_splits_a_message_fails_clearly(cluster):
    from broker.client.connection import BrokerConnection
    from broker.common.errors import LogbusError
    from broker.common.message import encode_message_set

    from airflow_provider_logbus.cluster import LogbusCluster

    broker = cluster.start_broker(0)
    with BrokerConnection(*broker.address) as conn:
        conn.create_topic("split", 1)
        conn.produce("split", 0, encode_message_set([(None, b"x" * 100, 1)] * 3), acks=-1)
    with LogbusCluster(cluster.zookeeper) as c, pytest.raises(LogbusError, match="not a message boundary"):
        list(c.read_range("split", 0, 0, 122 + 50))
