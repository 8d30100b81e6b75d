"""Bad input on the Kafka listener (issue 36): a damaged, oversized or misdirected batch
is answered with the Kafka error code it deserves and appends nothing; requests the
listener does not serve are answered UNSUPPORTED_VERSION; frames that cannot be read
close only their own connection — and the broker serves other clients throughout.
The batches are librdkafka's own (captured from the real client), then damaged."""

from __future__ import annotations

import dataclasses
import datetime
import io
import socket
import struct

import pytest
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode as KafkaError
from kio.serial import entity_reader, entity_writer

from broker.common.kafka import frames
from broker.common.kafka.apis import ApiKey
from broker.server.kafka.messages import response_module
from harness.cluster import LocalCluster
from harness.frames import read_frame
from tests.integration.brokerutil import connect, read_partition
from tests.kafka.test_idempotence import librdkafka_produce_request


def encode_request(request, api_key: int, version: int, correlation_id: int = 7) -> bytes:
    """A request frame (size included) with the header its version calls for."""
    out = io.BytesIO()
    out.write(struct.pack(">hhi", api_key, version, correlation_id))
    if frames.request_header_version(api_key, version) >= 1:
        out.write(struct.pack(">h", 4) + b"test")
    if frames.request_header_version(api_key, version) >= 2:
        out.write(b"\0")
    entity_writer(type(request))(out, request)
    body = out.getvalue()
    return struct.pack(">i", len(body)) + body


def exchange(address: str, frame: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(frame)
        return read_frame(sock)


def produce_answer(address: str, frame: bytes):
    """Partition 0's answer to a Produce frame."""
    header = frames.decode_request_header(frame[4:])
    answer = exchange(address, frame)
    skip = 4 + frames.response_header_version(ApiKey.PRODUCE, header.api_version)
    response, _ = entity_reader(response_module(ApiKey.PRODUCE, header.api_version).ProduceResponse)(answer, skip)
    return response.responses[0].partition_responses[0]


def with_partition(frame: bytes, records: bytes | None = None, partition: int | None = None) -> bytes:
    """librdkafka's Produce frame with its one partition's records or index replaced."""
    header, request = frames.decode_request(frame[4:])
    topic = request.topic_data[0]
    part = topic.partition_data[0]
    part = dataclasses.replace(part, records=part.records if records is None else records,
                               index=part.index if partition is None else partition)
    request = dataclasses.replace(request, topic_data=(dataclasses.replace(topic, partition_data=(part,)),))
    return encode_request(request, ApiKey.PRODUCE, header.api_version)


def records_of(frame: bytes) -> bytes:
    return bytes(frames.decode_request(frame[4:])[1].topic_data[0].partition_data[0].records)


def serving(broker) -> bool:
    """Another client is served meanwhile: AdminClient's metadata answers."""
    return "t" in AdminClient({"bootstrap.servers": broker.kafka_bootstrap}).list_topics(timeout=30).topics


@pytest.fixture
def brokers(cluster: LocalCluster):
    first = cluster.start_broker(0, kafka=True, settings={"message.max.bytes": 4096})
    second = cluster.start_broker(1, kafka=True, settings={"message.max.bytes": 4096})
    connect(first).create_topic("t", 2)
    return first, second


def leader_of(cluster: LocalCluster, partition: int) -> int:
    metadata = AdminClient({"bootstrap.servers": cluster.brokers[0].kafka_bootstrap}).list_topics("t", timeout=30)
    return metadata.topics["t"].partitions[partition].leader


def test_damaged_oversized_and_misdirected_batches_are_refused_and_append_nothing(cluster, brokers):
    frame = librdkafka_produce_request("t")
    leader = cluster.brokers[leader_of(cluster, 0)]
    other = next(b for b in brokers if b is not leader)

    damaged = bytearray(records_of(frame))
    damaged[-1] ^= 0xFF  # a bit of the last record: the CRC no longer matches
    answer = produce_answer(leader.kafka_bootstrap, with_partition(frame, records=bytes(damaged)))
    assert answer.error_code == KafkaError.corrupt_message and "CRC" in answer.error_message

    big = bytearray(records_of(frame))
    big += b"\0" * 5000
    struct.pack_into(">i", big, 8, len(big) - 12)
    answer = produce_answer(leader.kafka_bootstrap, with_partition(frame, records=bytes(big)))
    assert answer.error_code == KafkaError.message_too_large, answer

    answer = produce_answer(other.kafka_bootstrap, frame)  # partition 0 is led by the other broker
    assert answer.error_code == KafkaError.not_leader_or_follower

    answer = produce_answer(leader.kafka_bootstrap, with_partition(frame, partition=7))
    assert answer.error_code == KafkaError.unknown_topic_or_partition

    assert read_partition(connect(leader), "t", 0) == []  # nothing appended
    assert serving(leader)
    assert produce_answer(leader.kafka_bootstrap, frame).error_code == KafkaError.none  # the real batch is


def test_unserved_requests_are_answered_unsupported_version(brokers):
    broker = brokers[0]
    answer = exchange(broker.kafka_bootstrap, encode_request(_fetch_v13(), ApiKey.FETCH, 13))  # served: 4-12
    response, _ = entity_reader(response_module(ApiKey.FETCH, 13).FetchResponse)(answer, 5)  # header v1: 5 bytes
    assert response.error_code == KafkaError.unsupported_version
    end_txn = encode_request(_end_txn(), 26, 3)  # transactions: a known API, not served
    answer = exchange(broker.kafka_bootstrap, end_txn)
    response, _ = entity_reader(response_module(26, 3).EndTxnResponse)(answer, 5)
    assert response.error_code == KafkaError.unsupported_version
    versions = exchange(broker.kafka_bootstrap, struct.pack(">i", 10) + struct.pack(">hhi", 18, 99, 9) + b"\xff\xff")
    assert struct.unpack_from(">ih", versions) == (9, KafkaError.unsupported_version)  # KIP-511's v0 answer
    assert serving(broker)


@pytest.mark.parametrize("frame", [
    struct.pack(">i", 4) + b"\x00\x00\x00",  # shorter than a header
    struct.pack(">i", 10) + struct.pack(">hhih", 9999, 0, 1, -1),  # an API key no schema knows
    struct.pack(">i", 14) + struct.pack(">hhih", 0, 9, 1, -1) + b"\x01\x02\x03\x04",  # Produce v9 cut short
    struct.pack(">i", 1 << 30) + b"\x00" * 16,  # a frame over socket.request.max.bytes
    struct.pack(">i", 10) + struct.pack(">hhih", 0, 2, 1, -1),  # Produce v2: removed by Kafka 4.0, no schema
], ids=["short", "unknown-api", "truncated-body", "oversized-frame", "removed-version"])
def test_unreadable_frames_close_their_connection_only(brokers, frame):
    broker = brokers[0]
    with pytest.raises(ConnectionError):
        exchange(broker.kafka_bootstrap, frame)
    assert serving(broker)


def _fetch_v13():
    from kio.schema.fetch.v13.request import FetchRequest
    from kio.static.primitive import i8, i32

    return FetchRequest(replica_id=i32(-1), max_wait=datetime.timedelta(0), min_bytes=i32(1), max_bytes=i32(1 << 20),
                        isolation_level=i8(0), session_id=i32(0), session_epoch=i32(-1), topics=(),
                        forgotten_topics_data=(), rack_id="")


def _end_txn():
    from kio.schema.end_txn.v3.request import EndTxnRequest
    from kio.static.primitive import i16, i64

    return EndTxnRequest(transactional_id="tx", producer_id=i64(1), producer_epoch=i16(0), committed=True)
