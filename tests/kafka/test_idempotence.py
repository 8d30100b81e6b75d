"""A Kafka producer's retry is a duplicate: librdkafka's own Produce request (captured
from the real client, tests/unit/kafka_capture.py) sent again — as a producer that
lost the answer does — is answered with the first append's offset and stored once,
also after the broker is killed -9 and restarts (its producer state rebuilt from the
log's stored Kafka batches)."""

from __future__ import annotations

import socket
import struct

from confluent_kafka import Producer
from kio.schema.errors import ErrorCode as KafkaError
from kio.serial import entity_reader

from broker.common.kafka import frames
from broker.common.kafka.apis import ApiKey
from broker.server.kafka.messages import response_module
from harness.cluster import LocalCluster
from tests.integration.brokerutil import connect, read_partition
from tests.unit.kafka_capture import CaptureBroker, _read_exactly


def librdkafka_produce_request(topic: str) -> bytes:
    """The frame (size field included) of a real idempotent Produce request: 3 records."""
    capture = CaptureBroker(topic)
    try:
        producer = Producer({"bootstrap.servers": capture.address, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 50})
        for i in range(3):
            producer.produce(topic, f"record {i}".encode(), partition=0)
        assert producer.flush(30) == 0
        frame = capture.requests(ApiKey.PRODUCE)[0]
    finally:
        capture.close()
    return struct.pack(">i", len(frame)) + frame


def send(address: str, frame: bytes) -> tuple[int, int]:
    """(error code, base offset) of partition 0's answer to a Produce frame."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(frame)
        answer = _read_exactly(sock, struct.unpack(">i", _read_exactly(sock, 4))[0])
    header = frames.decode_request_header(frame[4:])
    schema = response_module(ApiKey.PRODUCE, header.api_version).ProduceResponse
    response, _ = entity_reader(schema)(answer, 4 + (1 if frames.response_header_version(0, header.api_version) else 0))
    part = response.responses[0].partition_responses[0]
    return part.error_code, part.base_offset


def test_a_retried_kafka_batch_is_stored_once_and_answered_with_its_first_offset(cluster: LocalCluster):
    broker = cluster.start_broker(0, kafka=True, settings={"num.partitions": 1})
    frame = librdkafka_produce_request("t")
    connect(broker).create_topic("t", 1)
    first = send(broker.kafka_bootstrap, frame)
    again = send(broker.kafka_bootstrap, frame)
    assert first[0] == again[0] == KafkaError.none
    assert again[1] == first[1]

    broker.kill()  # no clean shutdown: the producer state comes back from the stored batch
    cluster.start_broker(0)
    after_restart = send(broker.kafka_bootstrap, frame)
    assert after_restart == first
    values = [m.value for m in read_partition(connect(broker), "t", 0)]
    assert values == [b"record 0", b"record 1", b"record 2"]  # once
