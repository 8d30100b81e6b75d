"""`Producer.produce`: `send` without a future (issue 38). Every guarantee of `send`
holds with nothing to wait on: each message delivered once and in its partition's
order, told once by `on_delivery`, counted by the report, and a refusal or failure
reported rather than lost."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from broker.client.errors import ProduceError, QueueFull
from broker.client.partitioner import partition_for_key
from broker.client.producer import Producer
from broker.common.zklayout import create_topic
from harness.process import wait_until
from tests.integration.clientutil import wait_visible


@pytest.mark.parametrize("acks,idempotent", [(0, False), (1, False), (1, True)])
@pytest.mark.parametrize("batch_size", [1, 50])
def test_produced_messages_arrive_once_in_order_and_each_is_told_once(cluster, zk, zk_connect, acks, idempotent,
                                                                       batch_size):
    cluster.start_broker(0)
    create_topic(zk, "produced", 3)
    told: list[int] = []
    with Producer(zookeeper=zk_connect, mode="async", acks=acks, batch_size=batch_size, monitoring=False,
                  enable_idempotence=idempotent, on_delivery=lambda b: told.append(b.count)) as producer:
        for i in range(600):
            assert producer.produce("produced", b"%d" % i, key=b"k%d" % (i % 3)) is None
        report = producer.flush(60)
    assert (report.delivered, report.failed, sum(told)) == (600, [], 600)
    visible = wait_visible(zk_connect, "produced", 600)
    for k in range(3):
        mine = [int(m.value) for m in visible[partition_for_key(b"k%d" % k, 3)] if m.key == b"k%d" % k]
        assert mine == list(range(k, 600, 3)), "each key's messages once, in the order produced"


def test_produce_places_and_converts_as_send_does(cluster, zk, zk_connect):
    """Text values and keys, an explicit partition, and a topic the producer has not
    seen yet (created by the broker's default) go as with `send`."""
    cluster.start_broker(0)
    create_topic(zk, "placed", 4)
    with Producer(zookeeper=zk_connect, mode="async", acks=1, monitoring=False) as producer:
        producer.produce("placed", "text", key="user-1")
        producer.produce("placed", b"third", partition=3)
        producer.produce("fresh", b"first of a new topic")
        assert producer.flush(60).delivered == 3
    visible = wait_visible(zk_connect, "placed", 2)
    assert [(m.key, m.value) for m in visible[partition_for_key(b"user-1", 4)]] == [(b"user-1", b"text")]
    assert [m.value for m in visible[3] if m.key is None] == [b"third"]
    assert [m.value for ms in wait_visible(zk_connect, "fresh", 1).values() for m in ms] == [b"first of a new topic"]


def test_a_refused_message_is_reported_not_lost_and_sync_mode_raises(cluster, zk, zk_connect):
    cluster.start_broker(0)
    create_topic(zk, "narrow", 2)
    failed = []
    with Producer(zookeeper=zk_connect, mode="async", monitoring=False, on_error=failed.extend) as producer:
        producer.produce("narrow", b"fits", partition=1)
        producer.produce("narrow", b"nowhere", partition=7)
        report = producer.flush(60)
    assert report.delivered == 1
    assert [(f.value, f.partition, "no partition 7" in str(f.error)) for f in report.failed] == [(b"nowhere", 7, True)]
    assert [f.value for f in failed] == [b"nowhere"]
    with Producer(zookeeper=zk_connect, mode="sync", monitoring=False) as producer:
        with pytest.raises(ProduceError, match="no partition 7"):
            producer.produce("narrow", b"nowhere", partition=7)
        assert producer.produce("narrow", b"waited for", partition=0) is None
    assert b"waited for" in [m.value for m in wait_visible(zk_connect, "narrow", 2)[0]]


def test_produce_is_bounded_by_the_queue_while_the_broker_is_down(cluster, zk, zk_connect):
    """No future to hold, and still no unbounded memory: with the only broker down the
    queue fills and `produce` raises (queue_full="raise"); close reports every message
    it could not deliver."""
    broker = cluster.start_broker(0)
    create_topic(zk, "stalled", 1)
    producer = Producer(zookeeper=zk_connect, mode="async", acks=1, monitoring=False, queue_size=100,
                        queue_full="raise", delivery_timeout_ms=120_000)
    try:
        producer.produce("stalled", b"before", partition=0)
        assert producer.flush(30).delivered == 1
        broker.stop()
        wait_until(lambda: not producer.metadata.brokers(), 30, "the broker to leave the registry")
        for i in range(100):
            producer.produce("stalled", b"%d" % i, partition=0)
        with pytest.raises(QueueFull):
            producer.produce("stalled", b"one too many", partition=0)
    finally:
        report = producer.close(1)
    assert report.delivered + len(report.failed) == 100 and report.pending == 0


@pytest.mark.long
def test_a_broker_paused_past_the_timeout_stores_each_produced_value_once(cluster, zk, zk_connect):
    """The fault that made send()'s retries duplicate (issue 23), through `produce`: the
    broker SIGSTOPped for 8 s (past the 1 s request timeout) with 200 messages in flight,
    each retried; on SIGCONT it reads the stale requests and the retries. Every value is
    stored once and the report counts each once; a future-less batch settles as any."""
    broker = cluster.start_broker(0)
    create_topic(zk, "paused", 1)
    with Producer(zookeeper=zk_connect, mode="async", acks=1, request_timeout_ms=1000, retries=50,
                  retry_backoff_ms=200, delivery_timeout_ms=90_000, monitoring=False) as producer:
        producer.produce("paused", b"first", partition=0)
        assert producer.flush(30).delivered == 1  # the topic and the producer id are known
        broker.pause()
        try:
            for i in range(200):
                producer.produce("paused", b"v %03d" % i, partition=0)
            time.sleep(8)  # the fault's length, past the request timeout: not a wait for a condition
        finally:
            broker.resume()
        report = producer.flush(90)
    assert (report.delivered, report.failed) == (200, [])
    counts = Counter(m.value for m in wait_visible(zk_connect, "paused", 201)[0])
    assert sum(counts.values()) == 201 and set(counts.values()) == {1}, counts.most_common(3)
