"""Produce and fetch through a real broker process."""

import pytest

from broker.common.errors import OffsetOutOfRange
from broker.common.message import encode_message_set, iter_messages
from broker.common.protocol import FetchRequest

from .brokerutil import connect, produce, read_partition, wait_flushed


@pytest.fixture
def broker(cluster):
    return cluster.start_broker(0)


@pytest.fixture
def conn(broker):
    c = connect(broker)
    c.create_topic("events", 2)
    yield c
    c.close()


def test_round_trip_through_produce_and_fetch(conn):
    values = [b"event-%d" % i for i in range(100)]
    result = produce(conn, "events", 0, values)
    assert result.base_offset == 0
    assert [m.value for m in read_partition(conn, "events", 0)] == values


def test_next_offset_is_offset_plus_4_plus_size(conn):
    produce(conn, "events", 0, [b"a" * 10, b"b" * 200, b"c"])
    messages = read_partition(conn, "events", 0)
    assert [m.offset for m in messages] == [0, 32, 32 + 222]
    for m in messages:
        assert m.next_offset == m.offset + 4 + (22 - 4 + len(m.value))


def test_produce_answers_base_and_next_offset(conn):
    first = produce(conn, "events", 1, [b"x" * 78])
    second = produce(conn, "events", 1, [b"y"])
    assert (first.base_offset, first.next_offset) == (0, 100)
    assert (second.base_offset, second.next_offset) == (100, 123)


def test_fetch_past_the_end_is_out_of_range(conn):
    produce(conn, "events", 0, [b"x"])
    with pytest.raises(OffsetOutOfRange, match="outside the range"):
        conn.fetch("events", 0, 10_000)


def test_fetch_exactly_at_the_end_is_empty(conn):
    result = produce(conn, "events", 0, [b"x", b"y"])
    response = conn.fetch("events", 0, result.next_offset)
    assert len(response.messages) == 0
    assert response.high_watermark == result.next_offset


def test_fetch_ending_mid_message_returns_partial_tail_that_clients_drop(conn):
    produce(conn, "events", 0, [b"a" * 100, b"b" * 100])
    response = conn.fetch("events", 0, 0, max_bytes=150)
    assert len(response.messages) == 150
    assert [m.value for m in iter_messages(response.messages, 0)] == [b"a" * 100]


def test_message_larger_than_max_bytes_needs_a_bigger_fetch(conn):
    produce(conn, "events", 0, [b"z" * 5000])
    small = conn.fetch("events", 0, 0, max_bytes=1000)
    assert list(iter_messages(small.messages, 0)) == []
    big = conn.fetch("events", 0, 0, max_bytes=8000)
    assert [m.value for m in iter_messages(big.messages, 0)] == [b"z" * 5000]


def test_acks_zero_gets_no_response_but_is_stored(conn):
    produce(conn, "events", 0, [b"fire", b"forget"], acks=0)
    result = produce(conn, "events", 0, [b"last"], acks=-1)  # in order behind the acks=0 request
    assert result.base_offset == 2 * (22 + 4) + 2  # 'fire' + 'forget'
    assert [m.value for m in read_partition(conn, "events", 0)] == [b"fire", b"forget", b"last"]


def test_a_connection_keeps_no_record_of_acks_zero_requests(conn):
    """An acks=0 request gets no answer, so nothing may wait for one: the connection
    kept (correlation id, expects-no-answer) for each until a later answer popped them,
    and a producer that only sends acks=0 never reads one — a web server's producer
    grew by about 90 bytes a request for as long as it ran. Memory retained by the
    connection's module after 20,000 acks=0 requests must stay near nothing."""
    import tracemalloc

    from broker.client import connection
    from broker.common.protocol import ApiKey, ProduceRequest

    body = ProduceRequest(0, 1000, "events", 0, encode_message_set([(None, b"x", 1)])).encode()
    conn.send_many([(ApiKey.PRODUCE, body, len(body))] * 10, expects_response=False)  # warm: the deque's first blocks
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(2_000):
            conn.send_many([(ApiKey.PRODUCE, body, len(body))] * 10, expects_response=False)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    only = [tracemalloc.Filter(True, connection.__file__)]
    grown = sum(s.size_diff for s in after.filter_traces(only).compare_to(before.filter_traces(only), "filename"))
    assert grown < 64 * 1024, f"the connection kept {grown} bytes for 20,000 requests nobody answers"
    result = produce(conn, "events", 0, [b"last"], acks=-1)  # an answered request still pairs up
    assert result.base_offset == 20_010 * (22 + 1)


def test_pipelined_requests_are_answered_in_order(conn):
    from broker.common.protocol import ApiKey, ProduceRequest

    ids = []
    for i in range(50):
        data = encode_message_set([(None, b"%d" % i, 1)])
        ids.append(conn.send(ApiKey.PRODUCE, ProduceRequest(1, 1000, "events", 0, data).encode()))
    offsets = []
    for _ in ids:
        code, reader = conn.receive()
        assert code == 0
        offsets.append(reader.int64())
    assert offsets == sorted(offsets)
    wait_flushed(conn, "events", 0, offsets[-1] + 1)
    assert [int(m.value) for m in read_partition(conn, "events", 0)] == list(range(50))


def test_multiproduce_and_multifetch_cover_several_partitions(conn):
    from broker.common.protocol import ProducePart

    parts = [ProducePart("events", p, encode_message_set([(None, b"p%d" % p, 1)])) for p in (0, 1)]
    parts.append(ProducePart("events", 7, encode_message_set([(None, b"bad", 1)])))
    results = conn.multiproduce(parts, acks=-1)
    assert [r.error_code for r in results] == [0, 0, 3]
    fetched = conn.multifetch([FetchRequest("events", p, 0, 1000) for p in (0, 1)])
    assert [[m.value for m in iter_messages(r.unwrap().messages, 0)] for r in fetched] == [[b"p0"], [b"p1"]]


def test_offsets_earliest_latest_and_before_time(cluster):
    broker = cluster.start_broker(1, {"log.segment.bytes": 1024})
    with connect(broker) as conn:
        conn.create_topic("timed", 1)
        for i in range(20):
            produce(conn, "timed", 0, [b"x" * 100], ts=1_000_000 + i * 1000)
        latest = conn.offsets("timed", 0, -1)
        assert conn.offsets("timed", 0, -2) == [0]
        assert latest == [20 * 122]
        before = conn.offsets("timed", 0, 1_000_000 + 10_500, 10)
        assert before[-1] == 0 and before == sorted(before, reverse=True)
        first_after = before[0]
        timestamps = [m.timestamp for m in read_partition(conn, "timed", 0, first_after)]
        assert min(timestamps) <= 1_000_000 + 10_500 and 1_000_000 + 11_000 in timestamps


def test_segments_roll_and_reads_cross_them(cluster):
    broker = cluster.start_broker(2, {"log.segment.bytes": 1024})
    with connect(broker) as conn:
        conn.create_topic("rolled", 1)
        values = [b"%04d" % i * 25 for i in range(30)]
        for v in values:
            produce(conn, "rolled", 0, [v], acks=1)
        wait_flushed(conn, "rolled", 0, 30 * 122)
        assert [m.value for m in read_partition(conn, "rolled", 0, max_bytes=500)] == values
    segments = sorted((broker.log_dir / "rolled-0").glob("*.kafka"))
    assert len(segments) >= 3
    assert segments[1].name == "%020d.kafka" % (8 * 122)


def test_unflushed_messages_are_invisible_until_flushed(cluster):
    broker = cluster.start_broker(3, {"log.flush.interval.ms": 3_600_000, "log.flush.interval.messages": 1_000_000})
    with connect(broker) as conn:
        conn.create_topic("lazy", 1)
        produce(conn, "lazy", 0, [b"not yet"], acks=1)
        response = conn.fetch("lazy", 0, 0)
        assert (response.high_watermark, len(response.messages)) == (0, 0)
        produce(conn, "lazy", 0, [b"now"], acks=-1)  # acks=-1 flushes, covering both
        assert [m.value for m in read_partition(conn, "lazy", 0)] == [b"not yet", b"now"]


def test_long_poll_fetch_returns_when_data_arrives(cluster, broker):
    with connect(broker) as reader, connect(broker) as writer:
        reader.create_topic("poll", 1)
        from broker.common.protocol import ApiKey

        reader.send(ApiKey.FETCH, FetchRequest("poll", 0, 0, 10_000, max_wait_ms=20_000, min_bytes=1).encode())
        produce(writer, "poll", 0, [b"wake up"], acks=1)
        code, body = reader.receive()
        assert code == 0
        from broker.common.protocol import FetchResponse

        response = FetchResponse.read(body, version=0, requested=0)  # the request above is version 0
        assert [m.value for m in iter_messages(response.messages, 0)] == [b"wake up"]


def test_long_poll_fetch_times_out_empty(conn):
    response = conn.fetch("events", 0, 0, max_wait_ms=200, min_bytes=1)
    assert len(response.messages) == 0
