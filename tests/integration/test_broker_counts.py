"""The brokers' record counts (the audit's `broker` tier) on a real broker: records
of old and current event times, plain, batched and compressed, counted exactly in the
window of their timestamp once committed; the monitoring topic never counted."""

from __future__ import annotations

import time

from broker.client.brokercounts import read_broker_counts
from broker.client.monitoring import MONITORING_TOPIC
from broker.client.producer import Producer
from harness.process import wait_until
from tests.integration.clientutil import per_window, read_topic

TOPIC = "clicks"
SETTINGS = {"audit.count.interval.ms": 100, "log.flush.interval.ms": 20, "num.partitions": 2}


def test_committed_records_are_counted_per_window_of_their_event_time(cluster, zk, zk_connect):
    cluster.start_broker(0, SETTINGS)
    now = int(time.time() * 1000)
    hours_ago = [now - h * 3_600_000 for h in (0, 1, 5, 30)]  # late records count in their own window
    with Producer(zookeeper=zk_connect, acks=1, compression="gzip", linger_ms=5, monitoring=True) as producer:
        for i in range(400):
            producer.send(TOPIC, b"v%d" % i, timestamp=hours_ago[i % 4] + i)
        producer.flush()
    with Producer(zookeeper=zk_connect, acks=1, enable_idempotence=False, mode="sync", monitoring=False) as plain:
        for i in range(30):
            plain.send(TOPIC, b"p%d" % i, timestamp=hours_ago[3], partition=0)

    wait_until(lambda: sum(map(len, read_topic(zk_connect, TOPIC).values())) == 430, 30, "every record visible")
    stored = [m for messages in read_topic(zk_connect, TOPIC).values() for m in messages]
    expected = per_window(TOPIC, stored)
    assert len(expected) >= 4 and sum(expected.values()) == 430  # four hours' windows (+ i ms may cross one)

    def caught_up():
        counts = read_broker_counts(zk, [TOPIC])
        return counts if sum(counts.counts.values()) == len(stored) and len(counts.upto) == 2 else None

    counts = wait_until(caught_up, 30, "the leader to count every committed record")
    assert counts.counts == expected
    assert all(counts.began[(TOPIC, p)] == 0 for p in (0, 1))
    assert read_topic(zk_connect, MONITORING_TOPIC)  # the producer published monitoring events ...
    assert MONITORING_TOPIC not in read_broker_counts(zk).topics()  # ... which are never counted
