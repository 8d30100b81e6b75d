"""The audit's broker tier for a topic only a Kafka client writes (docs/provider.md,
"The broker tier"): librdkafka's records of old and current event times, compressed,
counted by the broker exactly per window of each record's own timestamp."""

from __future__ import annotations

import time

from broker.client.brokercounts import read_broker_counts
from harness.process import wait_until
from tests.integration.brokerutil import connect, read_partition
from tests.integration.clientutil import per_window
from tests.kafka.clients import producer


def test_records_a_kafka_client_produced_are_counted_in_the_window_of_their_event_time(cluster, zk):
    broker = cluster.start_broker(0, {"audit.count.interval.ms": 100}, kafka=True)
    now = int(time.time() * 1000)
    p = producer(broker.kafka_bootstrap, **{"compression.type": "gzip"})
    for i in range(600):  # batches mixing current records with records of 1, 7 and 30 hours ago
        p.produce("kafka_clicks", b"click %d" % i, partition=0, timestamp=now - [0, 1, 7, 30][i % 4] * 3_600_000)
        p.poll(0)
    assert p.flush(60) == 0
    stored = read_partition(connect(broker), "kafka_clicks", 0)
    assert len(stored) == 600
    counts = wait_until(lambda: (c := read_broker_counts(zk, ["kafka_clicks"])).upto.get(("kafka_clicks", 0), 0)
                        >= stored[-1].next_offset and c, 30, "the broker to count every record")
    assert counts.counts == per_window("kafka_clicks", stored) and sum(counts.counts.values()) == 600
