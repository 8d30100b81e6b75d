"""A replicated topic survives the loss of its leader: kill -9 the leader of a
three-replica partition while an acks=-1 producer sends and a consumer group reads.
A new leader from the ISR takes over with the next leader epoch; the producer sees no
error (only retries), every acknowledged message is there, in order; the consumer
group goes on from where it was and its committed offset is valid on the new leader
(byte offsets are the same on every replica)."""

from __future__ import annotations

import threading

import pytest

from broker.client.group import ConsumerGroup
from broker.client.producer import Producer
from broker.common.zklayout import create_topic, read_partition_state
from harness.process import wait_until
from tests.integration.clientutil import Collector, read_topic

SETTINGS = {"zookeeper.session.timeout.ms": 3000, "log.flush.interval.ms": 20, "replica.lag.time.max.ms": 5000}
TOPIC = "orders"
BEFORE, AFTER = 150, 150


@pytest.mark.parametrize("discovery", ["zookeeper", "brokers"])
def test_a_replicated_topic_survives_the_loss_of_its_leader(cluster, zk, zk_connect, discovery):
    """The producer finds leaders by watching ZooKeeper, or by METADATA (version 1)
    from a broker list."""
    for broker_id in range(3):
        cluster.start_broker(broker_id, SETTINGS)
    where = ({"zookeeper": zk_connect} if discovery == "zookeeper"
             else {"brokers": [f"{h}:{p}" for h, p in (b.address for b in cluster.brokers.values())]})
    create_topic(zk, TOPIC, 1, replication_factor=3)
    initial = read_partition_state(zk, TOPIC, 0).state

    # sync: one message at a time, so a retry cannot overtake a later message (an async
    # producer with several batches in flight may reorder retried batches, docs/clients.md)
    producer = Producer(**where, acks=-1, mode="sync", monitoring=False, retries=10_000,
                        retry_backoff_ms=200, delivery_timeout_ms=120_000, request_timeout_ms=10_000, linger_ms=2)
    group = ConsumerGroup("readers", {TOPIC: 1}, zk_connect, consumer_timeout_ms=200, max_wait_ms=100,
                          auto_commit_interval_ms=200, zookeeper_session_timeout_ms=3000)
    collector = Collector(group)
    sent = [b"m%05d" % i for i in range(BEFORE + AFTER)]
    try:
        results = [producer.send(TOPIC, v) for v in sent[:BEFORE]]
        wait_until(lambda: len(collector.values()) >= BEFORE // 2, 60, "the group to read before the failover")

        cluster.brokers[initial.leader].kill()
        more = threading.Thread(target=lambda: results.extend(producer.send(TOPIC, v) for v in sent[BEFORE:]))
        more.start()
        state = wait_until(lambda: (s := read_partition_state(zk, TOPIC, 0)[0]).leader != initial.leader and s, 60,
                           "a new leader")
        assert state.leader in initial.isr and state.leader_epoch == initial.leader_epoch + 1
        more.join(120)

        assert len(results) == len(sent)  # a send that failed after its retries would have raised
        wait_until(lambda: set(collector.values()) >= set(sent), 120, "the group to read every message")
    finally:
        producer.close(30)
        collector.close()

    log = read_topic(zk_connect, TOPIC)[0]
    at = {m.offset: m.value for m in log}
    assert [at.get(r.offset) for r in results] == sent  # every acknowledged message where it was acknowledged
    stored = [m.value for m in log]
    assert set(stored) == set(sent)
    first_seen = [stored.index(v) for v in sent]
    assert first_seen == sorted(first_seen), "acknowledged messages were reordered"
    received = collector.values()
    assert sorted(received) == sorted(stored), "the group re-read or skipped messages across the failover"
    assert [received.index(v) for v in sent] == sorted(received.index(v) for v in sent)
