"""Bad input gets its error code (or only its connection closed), is logged, and never
corrupts a log or disturbs other clients."""

import socket
import struct

import pytest

from broker.common.errors import (
    InvalidMessage, InvalidRequest, InvalidTopicName, MessageTooLarge, RequestTooLarge, UnknownPartition,
    UnknownTopic, UnsupportedApi,
)
from broker.common.message import encode_message_set
from broker.common.protocol import ApiKey, ProduceRequest, decode_response_header, encode_request, raise_for_error
from harness.process import wait_until

from .brokerutil import connect, produce, read_partition

GOOD = [b"good-1", b"good-2"]


@pytest.fixture
def broker(cluster):
    return cluster.start_broker(0, {
        "message.max.bytes": 1000, "socket.request.max.bytes": 64 * 1024,
        "connections.max.idle.ms": 1500, "request.read.timeout.ms": 1500, "auto.create.topics": "false",
    })


@pytest.fixture
def conn(broker):
    c = connect(broker)
    c.create_topic("events", 1)
    produce(c, "events", 0, GOOD)
    yield c
    c.close()


def assert_log_intact(broker):
    """The partition still holds exactly the good messages, and a fresh client works."""
    with connect(broker) as fresh:
        assert [m.value for m in read_partition(fresh, "events", 0)] == GOOD


def raw_socket(broker) -> socket.socket:
    return socket.create_connection(broker.address, timeout=10)


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_bad_crc_is_invalid_message(conn, broker):
    data = bytearray(encode_message_set([(None, b"payload", 1)]))
    data[-1] ^= 0x55
    with pytest.raises(InvalidMessage, match="CRC mismatch"):
        conn.produce("events", 0, bytes(data), acks=1)
    assert_log_intact(broker)
    assert "CRC mismatch" in broker.log_tail()


def test_truncated_message_set_is_invalid_message(conn, broker):
    data = encode_message_set([(None, b"payload", 1)])
    with pytest.raises(InvalidMessage, match="partial entry"):
        conn.produce("events", 0, data[:-3], acks=1)
    assert_log_intact(broker)


def test_one_bad_message_rejects_the_whole_set(conn, broker):
    good = encode_message_set([(None, b"fine", 1)])
    bad = bytearray(encode_message_set([(None, b"broken", 1)]))
    bad[-2] ^= 1
    with pytest.raises(InvalidMessage):
        conn.produce("events", 0, good + bytes(bad), acks=1)
    assert_log_intact(broker)


def test_a_kafka_batch_entry_is_refused_to_a_native_produce(conn, broker):
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    from broker.common.kafka.records import kafka_entry

    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    builder.append(0, 1, None, b"smuggled", [])
    entry = kafka_entry(bytes(builder.build()), 0, 0, 1)  # well-formed, CRC right: only its magic is refused
    with pytest.raises(InvalidMessage, match="magic 4 at byte 0: a Kafka record batch is written only by the broker"):
        conn.produce("events", 0, entry, acks=1)
    assert_log_intact(broker)


def test_message_over_message_max_bytes_is_refused(conn, broker):
    with pytest.raises(MessageTooLarge, match="message.max.bytes=1000"):
        produce(conn, "events", 0, [b"x" * 2000])
    assert_log_intact(broker)


def test_request_over_socket_request_max_bytes_gets_error_then_close(broker, conn):
    sock = raw_socket(broker)
    header = struct.pack(">ihhi", 10 * 1024 * 1024, ApiKey.PRODUCE, 0, 77)
    sock.sendall(header + b"\x00" * 16)  # claims 10 MiB; the broker must not wait for it
    size = struct.unpack(">i", sock.recv(4))[0]
    correlation_id, code, reader = decode_response_header(sock.recv(size))
    assert correlation_id == 77
    with pytest.raises(RequestTooLarge, match="socket.request.max.bytes"):
        raise_for_error(code, reader)
    assert wait_until(lambda: closed_by_peer(sock), 10, "close")
    assert_log_intact(broker)


def test_negative_frame_size_closes_only_that_connection(broker, conn):
    sock = raw_socket(broker)
    sock.sendall(struct.pack(">i", -5) + b"junk")
    assert closed_by_peer(sock)
    assert produce(conn, "events", 0, [b"still served"]).base_offset > 0


def test_garbage_header_closes_only_that_connection(broker, conn):
    sock = raw_socket(broker)
    # a frame whose client_id length runs past its end
    sock.sendall(struct.pack(">ihhih", 12, 0, 0, 1, 500) + b"ab")
    assert closed_by_peer(sock)
    assert "unreadable request header" in broker.log_tail()
    assert_log_intact(broker)


def test_unknown_api_is_unsupported(conn):
    conn.send_frame(encode_request(99, 5, "test", b""))  # type: ignore[arg-type]
    conn._in_flight.append(5)  # a raw frame: tell the connection an answer is due
    code, reader = conn.receive()
    with pytest.raises(UnsupportedApi, match="api 99"):
        raise_for_error(code, reader)


def test_unknown_api_version_is_unsupported(conn):
    frame = bytearray(encode_request(ApiKey.METADATA, 6, "test", b"\x00\x00\x00\x00"))
    struct.pack_into(">h", frame, 6, 3)  # api_version 3
    conn.send_frame(bytes(frame))
    conn._in_flight.append(6)
    code, reader = conn.receive()
    with pytest.raises(UnsupportedApi, match="version 3"):
        raise_for_error(code, reader)


@pytest.mark.parametrize("topic", ["bad name", "a/b", "..", ".", "x" * 250, ""])
def test_bad_topic_names_are_refused(conn, topic):
    with pytest.raises(InvalidTopicName):
        produce(conn, topic, 0, [b"x"])


def test_unknown_topic_and_partition(conn):
    with pytest.raises(UnknownTopic, match="auto.create.topics is off"):
        produce(conn, "nosuch", 0, [b"x"])
    with pytest.raises(UnknownTopic):
        conn.fetch("nosuch", 0, 0)
    with pytest.raises(UnknownPartition, match="partitions 0..0"):
        conn.fetch("events", 3, 0)


def test_malformed_body_is_invalid_request(conn, broker):
    body = ProduceRequest(1, 100, "events", 0, b"").encode()[:-2]  # cut inside the set_size field
    conn.send(ApiKey.PRODUCE, body)
    code, reader = conn.receive()
    with pytest.raises(InvalidRequest, match="ends early"):
        raise_for_error(code, reader)
    assert_log_intact(broker)


def test_bad_acks_and_negative_sizes_are_invalid_request(conn):
    with pytest.raises(InvalidRequest, match="acks"):
        conn.produce("events", 0, encode_message_set([(None, b"x", 1)]), acks=5)
    with pytest.raises(InvalidRequest, match="negative"):
        conn.fetch("events", 0, 0, max_bytes=-1)


def test_create_topic_with_bad_arguments(conn):
    with pytest.raises(InvalidRequest, match="partitions"):
        conn.create_topic("zero", 0)
    with pytest.raises(InvalidRequest, match="replication factor"):
        conn.create_topic("replicated", 1, replication_factor=3)


def test_idle_connection_is_closed(broker, conn):
    sock = raw_socket(broker)
    assert wait_until(lambda: closed_by_peer(sock), 30, "idle close")
    assert "idle for" in broker.log_tail()


def test_half_sent_request_times_out(broker, conn):
    sock = raw_socket(broker)
    sock.sendall(struct.pack(">i", 100) + b"\x00\x01")  # promises 100 bytes, sends 2
    assert wait_until(lambda: closed_by_peer(sock), 30, "half-open close")
    assert "not completed within" in broker.log_tail()
    assert_log_intact(broker)
