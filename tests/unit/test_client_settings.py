"""Client settings that cannot work are refused by name, before any connection is
opened (neither address below exists)."""

from __future__ import annotations

import pytest

from broker.client.consumer import SimpleConsumer
from broker.client.group import ConsumerGroup
from broker.client.producer import Producer

NOWHERE = "127.0.0.1:1"
NO_ZOOKEEPER = "127.0.0.1:1"


@pytest.mark.parametrize("setting, value", [
    ("batch_size", 0), ("batch_bytes", 0), ("linger_ms", -1), ("queue_size", 0), ("max_block_ms", -5),
    ("retries", -1), ("retry_backoff_ms", -1), ("delivery_timeout_ms", 0), ("request_timeout_ms", 0),
    ("monitoring_window_ms", 0), ("batch_size", 2.5), ("queue_size", "100"), ("retries", True),
])
def test_a_setting_out_of_range_is_refused_by_name(setting, value):
    with pytest.raises(ValueError, match=f"^{setting} must be an integer of at least"):
        Producer(brokers=NOWHERE, **{setting: value})


def test_an_async_batch_that_would_expire_while_it_lingers_is_refused():
    with pytest.raises(ValueError, match=r"delivery_timeout_ms \(30000\) must exceed linger_ms \(60000\)"):
        Producer(brokers=NOWHERE, mode="async", linger_ms=60_000)


def test_idempotence_with_acks_zero_is_refused_by_name_and_works_when_turned_off():
    with pytest.raises(ValueError, match=r"enable_idempotence=True needs acks=1 or acks=-1.*enable_idempotence=False"):
        Producer(brokers=NOWHERE, acks=0)
    producer = Producer(brokers=NOWHERE, acks=0, enable_idempotence=False)  # accepted (nothing sent yet)
    assert producer.sender.idempotence is None
    producer.close(1)


@pytest.mark.parametrize("setting, value, message", [
    ("mode", "fire-and-forget", "mode must be"), ("acks", 2, "acks must be"), ("queue_full", "drop", "queue_full must"),
])
def test_a_choice_outside_its_values_is_refused(setting, value, message):
    with pytest.raises(ValueError, match=message):
        Producer(brokers=NOWHERE, **{setting: value})


@pytest.mark.parametrize("setting, value", [
    ("partition", -1), ("fetch_size", 0), ("max_fetch_size", 0), ("max_wait_ms", -1), ("min_bytes", -1),
    ("retry_timeout_ms", -1), ("retry_backoff_ms", -1), ("fetch_size", "1MB"),
])
def test_a_simple_consumer_setting_out_of_range_is_refused_by_name(setting, value):
    arguments = {"partition": 0, setting: value}
    partition = arguments.pop("partition")
    with pytest.raises(ValueError, match=f"^{setting} must be an integer of at least"):
        SimpleConsumer("clicks", partition, brokers=NOWHERE, **arguments)


@pytest.mark.parametrize("setting, value", [
    ("auto_commit_interval_ms", -1), ("consumer_timeout_ms", -1), ("fetch_size", 0), ("max_wait_ms", -1),
    ("queued_chunks", 0), ("rebalance_max_retries", -1), ("rebalance_backoff_ms", -1),
    ("zookeeper_session_timeout_ms", 0), ("queued_chunks", 1.5),
])
def test_a_consumer_group_setting_out_of_range_is_refused_by_name(setting, value):
    with pytest.raises(ValueError, match=f"^{setting} must be an integer of at least"):
        ConsumerGroup("loaders", {"clicks": 1}, NO_ZOOKEEPER, **{setting: value})
