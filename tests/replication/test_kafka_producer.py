"""librdkafka's idempotent producer (acks=all) through the Kafka listener while the
partition's leader is killed -9 and comes back, again and again: every record
acknowledged is stored once, in the order sent — the Kafka batches' producer ids,
epochs and sequences are the partition's producer state, replicated with the log, so
the new leader knows a retry of what the old one appended (docs/kafka.md,
"Idempotence")."""

from __future__ import annotations

import threading
from collections import Counter

from confluent_kafka import Producer

from harness.process import wait_until
from tests.integration.brokerutil import connect, read_partition
from tests.replication.replicated import BROKER_SETTINGS, create_replicated_topic, kill_leader_and_wait_back, state


def test_leaders_killed_under_a_kafka_idempotent_producer_leave_every_record_once(cluster, zk):
    for broker_id in range(3):
        cluster.start_broker(broker_id, BROKER_SETTINGS, kafka=True)
    topic = "kafka-killed"
    create_replicated_topic(cluster, zk, topic, partitions=1, replication_factor=3)
    bootstrap = ",".join(b.kafka_bootstrap for b in cluster.brokers.values())
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": 120_000, "retry.backoff.ms": 50})
    acked: list[tuple[bytes, int]] = []
    failed: list[str] = []
    stop = threading.Event()

    def on_delivery(err, msg):
        if err is None:
            acked.append((msg.value(), msg.offset()))
        else:
            failed.append(str(err))

    def produce_until_stopped():
        i = 0
        while not stop.is_set():
            try:
                producer.produce(topic, b"value %06d" % i, partition=0, on_delivery=on_delivery)
                i += 1
            except BufferError:
                pass
            producer.poll(0.001)

    sender = threading.Thread(target=produce_until_stopped)
    sender.start()
    try:
        for kill in range(3):
            wait_until(lambda: len(acked) > 1000 * (kill + 1), 90, f"acknowledgements before kill {kill}")
            kill_leader_and_wait_back(cluster, zk, topic)
    finally:
        stop.set()
        sender.join(60)
    assert producer.flush(120) == 0
    assert not failed, failed[:5]
    leader = cluster.brokers[state(zk, topic).leader]
    stored = read_partition(connect(leader), topic, 0)
    counts = Counter(m.value for m in stored)
    assert [v for v, n in counts.items() if n > 1] == []  # nothing stored twice
    assert {v for v, _ in acked} <= set(counts)  # nothing acknowledged lost
    assert [m.value for m in stored] == sorted(m.value for m in stored)  # in the order sent
    assert dict(acked) == {m.value: m.offset for m in stored if m.value in dict(acked)}  # at the offsets reported
