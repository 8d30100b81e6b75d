"""Monitoring events through real brokers: what producers publish, what the reader sums."""

from __future__ import annotations

from broker.client.monitoring import read_events, read_producer_counts
from broker.client.producer import Producer
from broker.common.zklayout import create_topic
from harness.process import wait_until

WINDOW = 60_000
BASE = 1_700_000_000_000 - 1_700_000_000_000 % WINDOW


def test_published_counts_per_window_match_what_was_sent(cluster, zk, zk_connect):
    cluster.start_broker(0)
    create_topic(zk, "clicks", 2)
    sent = {BASE: 0, BASE + WINDOW: 0, BASE + 2 * WINDOW: 0}
    producers = [Producer(zookeeper=zk_connect, monitoring_window_ms=WINDOW),
                 Producer(zookeeper=zk_connect, mode="async", monitoring_window_ms=WINDOW)]
    for i in range(300):
        ts = BASE + (i * 997) % (3 * WINDOW)
        producers[i % 2].send("clicks", b"x" * 10, timestamp=ts)
        sent[ts - ts % WINDOW] += 1
    producers[1].flush(30)  # publishes, and later publishes again on close: readers keep the latest
    producers[1].send("clicks", b"late", timestamp=BASE)
    sent[BASE] += 1
    for p in producers:
        assert p.close(30).ok
    expected = {("clicks", start): n for start, n in sent.items()}
    def published():  # the last events become visible once the broker flushes them
        counts = read_producer_counts(zk_connect)
        return {key: total.count for key, total in counts.items()} == expected and counts

    counts = wait_until(published, 30, f"published counts to reach {expected}")
    assert counts[("clicks", BASE + WINDOW)].bytes == 10 * sent[BASE + WINDOW]


def test_events_name_their_producer_and_window(cluster, zk, zk_connect):
    cluster.start_broker(0)
    with Producer(zookeeper=zk_connect, monitoring_window_ms=WINDOW) as producer:
        producer.send("views", b"v", timestamp=BASE + 5)
    events = wait_until(lambda: read_events(zk_connect), 30, "an event")
    assert [(e["tier"], e["producer_id"], e["topic"], e["window_start"], e["window_end"], e["count"])
            for e in events] == [("producer", producer.producer_id, "views", BASE, BASE + WINDOW, 1)]


def test_monitoring_can_be_switched_off(cluster, zk, zk_connect):
    cluster.start_broker(0)
    with Producer(zookeeper=zk_connect, monitoring=False) as producer:
        producer.send("quiet", b"v")
    assert not zk.exists("/brokers/topics/_logbus_monitoring")
    assert read_producer_counts(zk_connect) == {}


def test_monitoring_events_are_flushed_even_from_an_acks_zero_producer(cluster, zk, zk_connect):
    # a broker that flushes only hourly: data with acks=0 stays invisible, but the
    # monitoring events go with acks=-1, so they are readable as soon as close() returns
    cluster.start_broker(0, {"log.flush.interval.ms": 3_600_000, "log.flush.interval.messages": 1_000_000})
    create_topic(zk, "clicks", 1)
    with Producer(zookeeper=zk_connect, acks=0, enable_idempotence=False, monitoring_window_ms=WINDOW) as producer:
        for i in range(50):
            producer.send("clicks", b"x", timestamp=BASE + i)
    counts = read_producer_counts(zk_connect)
    assert {key: total.count for key, total in counts.items()} == {("clicks", BASE): 50}
