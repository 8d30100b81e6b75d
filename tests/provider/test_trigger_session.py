"""The deferred sensor's trigger in production: one ZooKeeper session for all its polls,
the connection's timeout, and a log line per change of state rather than per poll."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timedelta, timezone

import pytest

import airflow_provider_logbus.triggers.lag as trigger_module
from airflow_provider_logbus.sensors.lag import LogbusLagSensor
from airflow_provider_logbus.triggers.lag import LogbusLagTrigger

from .helpers import produce

HOUR = 3_600_000


@pytest.fixture
def polls(monkeypatch) -> list[str]:
    """The topic of every poll (`check_ready` call) a trigger makes."""
    real, seen = trigger_module.check_ready, []

    def counting(cluster, topic, *args):
        seen.append(topic)
        return real(cluster, topic, *args)

    monkeypatch.setattr(trigger_module, "check_ready", counting)
    return seen


def first_event(trigger: LogbusLagTrigger, timeout: float = 60) -> dict:
    async def run():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(run(), timeout))


@pytest.fixture
def waiting_topic(cluster) -> tuple[str, int]:
    """A topic whose data all lies before `after_ms`: a trigger on it keeps waiting."""
    cluster.start_broker(0, {"num.partitions": 2})
    now = int(time.time() * 1000)
    after_ms = now - now % HOUR
    produce(cluster.zookeeper, "pages", [after_ms - 60_000 + i for i in range(20)])
    return cluster.zookeeper, after_ms


def test_polls_of_a_trigger_share_one_zookeeper_session(waiting_topic, sessions, polls):
    zk, after_ms = waiting_topic
    trigger = LogbusLagTrigger(topic="pages", zookeeper=zk, complete_after_ms=after_ms, poll_interval=0.05,
                               timeout=1.5)
    assert first_event(trigger)["status"] == "timeout"
    assert len(polls) > 1
    assert len(sessions.clients) == 1
    assert not sessions.clients[0].connected  # closed when the trigger ended


def test_trigger_logs_its_waiting_state_once_not_at_every_poll(waiting_topic, sessions, polls, caplog):
    zk, after_ms = waiting_topic
    trigger = LogbusLagTrigger(topic="pages", zookeeper=zk, complete_after_ms=after_ms, poll_interval=0.05,
                               timeout=1.0)
    with caplog.at_level(logging.INFO, logger="airflow_provider_logbus.triggers.lag"):
        assert first_event(trigger)["status"] == "timeout"
    assert len(polls) > 1
    waiting = [r for r in caplog.records if r.name == "airflow_provider_logbus.triggers.lag"]
    assert len(waiting) == 1 and "waiting for pages" in waiting[0].getMessage()


def test_trigger_closes_its_session_when_cancelled(waiting_topic, sessions, polls):
    zk, after_ms = waiting_topic
    trigger = LogbusLagTrigger(topic="pages", zookeeper=zk, complete_after_ms=after_ms, poll_interval=0.05)

    async def cancel_after_polls():
        task = asyncio.ensure_future(anext(trigger.run()))
        deadline = asyncio.get_running_loop().time() + 30
        while len(polls) < 2:  # polling, its session open
            assert asyncio.get_running_loop().time() < deadline, "the trigger never polled twice"
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_after_polls())
    assert len(sessions.clients) == 1 and not sessions.clients[0].connected


def test_deferred_sensor_hands_the_connection_timeout_to_the_trigger(airflow_db, monkeypatch):
    from airflow.providers.common.compat.sdk import TaskDeferred

    monkeypatch.setenv("AIRFLOW_CONN_LOGBUS_SLOW", '{"conn_type": "logbus", "extra": '
                                                   '{"zookeeper": "127.0.0.1:1/x", "timeout": 5}}')
    sensor = LogbusLagSensor(task_id="wait", topic="pages", deferrable=True, logbus_conn_id="logbus_slow",
                             poke_interval=5, timeout=60)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({"data_interval_end": datetime(2024, 1, 1, tzinfo=timezone.utc)})
    trigger = deferred.value.trigger
    assert trigger.cluster_timeout == 5.0
    assert trigger.serialize()[1]["cluster_timeout"] == 5.0


def test_trigger_gives_up_on_an_unreachable_zookeeper_within_the_connection_timeout():
    trigger = LogbusLagTrigger(topic="pages", zookeeper="127.0.0.1:1/x", complete_after_ms=0, poll_interval=0.05,
                               cluster_timeout=2)
    event = first_event(trigger, timeout=10)  # the deadline: a trigger that keeps retrying fails here
    assert event["status"] == "error" and "within 2s" in event["message"]


def test_a_poking_sensor_keeps_one_session_for_all_its_pokes(waiting_topic, sessions, airflow_db):
    from .conftest import use_logbus_connection

    zk, after_ms = waiting_topic
    use_logbus_connection(zk)
    sensor = LogbusLagSensor(task_id="wait", topic="pages", grace=timedelta(0), poke_interval=0.05, timeout=1,
                             mode="poke")
    context = {"data_interval_end": datetime.fromtimestamp(after_ms / 1000, timezone.utc)}
    with pytest.raises(Exception, match="(?i)timed? ?out|timeout"):
        sensor.execute(context)
    assert len(sessions.clients) == 1 and not sessions.clients[0].connected
