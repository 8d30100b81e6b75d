"""The Kafka listener's data path with librdkafka (confluent-kafka), the client most
Kafka users run: an idempotent producer with acks=all and every codec, records read
back by a Kafka consumer and by logbus's own reader, a consumer resuming in the middle
of a batch (issue 35), offsets by time."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaProducer

from tests.integration.brokerutil import connect, produce, read_partition
from tests.kafka.clients import producer, produce_all, read_from

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]  # librdkafka's snappy is raw blocks


@pytest.mark.parametrize("codec", CODECS)
def test_an_idempotent_acks_all_producer_writes_every_record_once_with_each_codec(kafka_broker, codec):
    records = [(f"k{i}".encode(), f"value {i} ".encode() * 5, [("n", str(i).encode())]) for i in range(500)]
    reports = produce_all(producer(kafka_broker.kafka_bootstrap, **{"compression.type": codec}), "t", records)
    assert all(err is None for err, _ in reports), reports[:3]
    offsets = [offset for _, offset in reports]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)  # every record its own offset

    got = read_from(kafka_broker.kafka_bootstrap, "t", 0, 0, len(records))
    assert [(m.key(), m.value(), m.headers()) for m in got] == [(k, v, h) for k, v, h in records]
    assert [m.offset() for m in got] == offsets

    native = read_partition(connect(kafka_broker), "t", 0)  # logbus's own reader, the same records
    assert [(m.offset, m.key, m.value) for m in native] == [(o, k, v) for o, (k, v, _) in zip(offsets, records)]


def test_snappy_in_xerial_framing_as_kafkas_java_producer_writes_it_is_stored_and_read_back(kafka_broker):
    """Kafka's Java producer frames snappy the xerial way; kafka-python does the same.
    The broker read only raw snappy and refused such a batch as undecodable."""
    values = [f"xerial {i} ".encode() * 40 for i in range(300)]  # 48 KiB a batch: several xerial blocks
    p = KafkaProducer(bootstrap_servers=kafka_broker.kafka_bootstrap, acks="all", enable_idempotence=True,
                      compression_type="snappy", linger_ms=50, batch_size=1 << 20)
    try:
        futures = [p.send("t", v, partition=0) for v in values]
        p.flush(60)
        offsets = [f.get(30).offset for f in futures]
    finally:
        p.close(30)
    assert offsets == list(range(len(values)))
    got = read_from(kafka_broker.kafka_bootstrap, "t", 0, 0, len(values))  # librdkafka reads xerial too
    assert [m.value() for m in got] == values
    assert [m.value for m in read_partition(connect(kafka_broker), "t", 0)] == values  # and logbus's reader


def test_a_kafka_consumer_resumes_in_the_middle_of_a_batch(kafka_broker):
    records = [(None, f"r{i}".encode(), []) for i in range(40)]
    p = producer(kafka_broker.kafka_bootstrap, **{"linger.ms": 200, "compression.type": "lz4"})
    offsets = [o for _, o in produce_all(p, "t", records)]
    assert len({o - i for i, o in enumerate(offsets)}) < len(offsets)  # several records shared a batch
    middle = 17
    got = read_from(kafka_broker.kafka_bootstrap, "t", 0, offsets[middle], len(records) - middle)
    assert [m.value() for m in got] == [v for _, v, _ in records[middle:]]
    assert got[0].offset() == offsets[middle]


def test_kafka_and_native_records_read_through_both_listeners(kafka_broker):
    conn = connect(kafka_broker)
    produce(conn, "t", 0, [b"native-1", b"native-2"])
    kafka = [o for _, o in produce_all(producer(kafka_broker.kafka_bootstrap), "t", [(None, b"kafka-1", [])])]
    produce(conn, "t", 0, [b"native-3"])
    got = read_from(kafka_broker.kafka_bootstrap, "t", 0, 0, 4)
    assert [m.value() for m in got] == [b"native-1", b"native-2", b"kafka-1", b"native-3"]
    assert got[2].offset() == kafka[0]
    native = read_partition(conn, "t", 0)
    assert [m.offset for m in native] == [m.offset() for m in got]


def test_the_high_watermark_is_one_past_the_last_record(kafka_broker):
    offsets = [o for _, o in produce_all(producer(kafka_broker.kafka_bootstrap), "t",
                                         [(None, b"x" * 100, []) for _ in range(3)])]
    consumer = Consumer({"bootstrap.servers": kafka_broker.kafka_bootstrap, "group.id": "unused"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition("t", 0), timeout=30)
    finally:
        consumer.close()
    assert (low, high) == (0, offsets[-1] + 1)  # a caught-up consumer's lag is 0


def test_offsets_for_times_finds_the_first_record_at_or_after_a_time(kafka_broker):
    p = producer(kafka_broker.kafka_bootstrap, **{"linger.ms": 0})
    offsets = []
    for ts in (1_000_000, 2_000_000, 3_000_000):
        p.produce("t", b"v", partition=0, timestamp=ts, on_delivery=lambda e, m: offsets.append(m.offset()))
        p.flush(30)
    consumer = Consumer({"bootstrap.servers": kafka_broker.kafka_bootstrap, "group.id": "unused"})
    try:  # one partition a call: librdkafka merges a partition asked for twice
        found = [consumer.offsets_for_times([TopicPartition("t", 0, ts)], timeout=30)[0].offset
                 for ts in (1_500_000, 3_000_000, 9_000_000)]
    finally:
        consumer.close()
    assert found == [offsets[1], offsets[2], -1]  # -1: every record older (Kafka's answer)


def test_a_produce_request_larger_than_the_scratch_buffer_is_stored(kafka_broker):
    """Found by bench.kafka_clients (issue 36): a request larger than the connection's
    scratch buffer (256 KiB) arrives in a buffer of its own, a writable memoryview,
    which kio's reader refused ("writable byte buffer"); the broker closed the
    connection and librdkafka, with its default batch.size of 1 MB, retried forever."""
    records = [(None, b"%06d" % i + b"v" * 294, []) for i in range(2_000)]  # 600 KB in one batch
    p = producer(kafka_broker.kafka_bootstrap, **{"linger.ms": 1000, "batch.size": 1_000_000,
                                                  "message.timeout.ms": 20_000})
    reports = produce_all(p, "t", records)
    assert all(err is None for err, _ in reports), reports[:3]
    assert len({o - i for i, (_, o) in enumerate(reports)}) < 5  # a few large batches, not one a record
    got = read_from(kafka_broker.kafka_bootstrap, "t", 0, 0, len(records))
    assert [m.value() for m in got] == [v for _, v, _ in records]
