"""Wire-level faults: a seeded fuzzer of every api, acks=0 requests that must never be
answered (not even with an error), and complete requests answered whatever follows
them in the same write."""

from __future__ import annotations

import socket
import struct

import pytest

from bench.fuzz import BROKER_SETTINGS, FUZZ_TOPIC, fuzz
from broker.client.connection import BrokerConnection
from broker.common.message import encode_message_set
from broker.common.protocol import (
    ApiKey, MetadataRequest, MetadataResponse, MultiProduceRequest, ProducePart, ProduceRequest,
    decode_response_header, encode_request,
)
from harness.frames import read_frame
from harness.process import wait_until

FUZZ_SEED = 20261122
FUZZ_CASES = 1000


@pytest.fixture
def broker(cluster):
    broker = cluster.start_broker(0, BROKER_SETTINGS)
    with BrokerConnection(*broker.address).connect() as admin:
        admin.create_topic(FUZZ_TOPIC, 1)
    return broker


def produce_frame(correlation_id: int, acks: int, topic: str = FUZZ_TOPIC, partition: int = 0,
                  messages: bytes | None = None) -> bytes:
    messages = encode_message_set([(None, b"ok", 1)]) if messages is None else messages
    return encode_request(ApiKey.PRODUCE, correlation_id, "t", ProduceRequest(acks, 1000, topic, partition, messages).encode())


def bad_crc() -> bytes:
    data = bytearray(encode_message_set([(None, b"payload", 1)]))
    data[-1] ^= 0x55
    return bytes(data)


def test_fuzzed_frames_never_crash_the_broker_or_disturb_others(broker):
    report = fuzz(broker, FUZZ_SEED, FUZZ_CASES, check_every=1)
    print(f"\nwire fuzz, seed {FUZZ_SEED}: {report}")
    assert report.crashes == 0 and broker.alive
    assert report.cases == FUZZ_CASES


ACKS0_BAD_INPUTS = {
    "bad CRC": lambda: produce_frame(1, 0, messages=bad_crc()),
    "unknown partition": lambda: produce_frame(1, 0, partition=7),
    "message too large": lambda: produce_frame(1, 0, messages=encode_message_set([(None, b"x" * 30_000, 1)])),
    "bad topic name": lambda: produce_frame(1, 0, topic="bad name"),
    "truncated set": lambda: produce_frame(1, 0, messages=encode_message_set([(None, b"payload", 1)])[:-3]),
    "multiproduce bad part": lambda: encode_request(ApiKey.MULTIPRODUCE, 1, "t", MultiProduceRequest(
        0, 1000, [ProducePart(FUZZ_TOPIC, 0, bad_crc()), ProducePart("bad name", 0, bad_crc())]).encode()),
}


@pytest.mark.parametrize("case", sorted(ACKS0_BAD_INPUTS))
def test_acks_zero_bad_input_gets_no_answer(broker, case):
    with socket.create_connection(broker.address, timeout=20) as sock:
        sock.sendall(ACKS0_BAD_INPUTS[case]() + produce_frame(42, 1))
        correlation_id, code, _ = decode_response_header(read_frame(sock))
    assert (correlation_id, code) == (42, 0), f"{case}: the first frame read must answer the acks=1 request"
    assert "refused" in broker.log_tail(200)


def test_acks_zero_refusals_are_logged_once_per_reason_not_per_request(broker):
    with socket.create_connection(broker.address, timeout=20) as sock:
        sock.sendall(produce_frame(1, 0, messages=bad_crc()) * 300 + produce_frame(42, 1))
        assert decode_response_header(read_frame(sock))[0] == 42
    log = broker.log_path.read_text()
    wait_until(lambda: "more refusals" in broker.log_path.read_text(), 10, "the summary line at close")
    assert log.count("acks=0 PRODUCE request 1 refused") == 1
    print(f"\n300 bad acks=0 requests: {log.count('acks=0 PRODUCE request')} log line(s) plus one summary")


def test_produce_too_short_to_show_its_acks_closes_the_connection(broker):
    with socket.create_connection(broker.address, timeout=20) as sock:
        sock.sendall(encode_request(ApiKey.PRODUCE, 1, "t", b""))
        assert sock.recv(1) == b""


def metadata_frame(correlation_id: int) -> bytes:
    return encode_request(ApiKey.METADATA, correlation_id, "t", MetadataRequest([FUZZ_TOPIC]).encode())


@pytest.mark.parametrize("announced", [64 << 20, 600 << 10], ids=["over-the-limit", "large-but-legal"])
def test_complete_request_is_answered_although_the_next_frame_has_begun(broker, announced):
    """Item 4: the answer must not wait for the rest of the next frame (or a timer)."""
    with socket.create_connection(broker.address, timeout=20) as sock:
        sock.sendall(metadata_frame(5) + struct.pack(">i", announced) + b"\x00\x05")
        correlation_id, code, reader = decode_response_header(read_frame(sock))
        assert (correlation_id, code) == (5, 0)
        assert MetadataResponse.decode(reader).topics[0].topic == FUZZ_TOPIC


def test_metadata_for_an_invalid_topic_name_is_invalid_topic_name(broker):
    with BrokerConnection(*broker.address).connect() as conn:
        topics = {t.topic: t.error_code for t in conn.metadata(["bad name", "no-such-topic"]).topics}
    assert topics == {"bad name": 6, "no-such-topic": 5}
