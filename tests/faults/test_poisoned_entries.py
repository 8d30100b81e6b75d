"""Poisoned entries: a PRODUCE whose compressed entry cannot be opened, or whose header
bits were flipped, is refused with InvalidMessage (2) and leaves the log intact; a
partition that holds a bad entry anyway (old or damaged data, written into a segment
file here) still delivers every good message before and after it, through
SimpleConsumer (raise, then seek past; or skip) and through a consumer group, one by one
or in batches."""

from __future__ import annotations

import gzip

import lz4.frame
import pytest
from aiokafka.codec import snappy_encode as aiokafka_snappy

from broker.client.consumer import SimpleConsumer
from broker.client.errors import CorruptMessageError
from broker.client.group import ConsumerGroup
from broker.common.errors import InvalidMessage, InvalidRequest
from broker.common.message import append_entry, encode_message_set, scan
from broker.common.protocol import ApiKey, FetchRequest
from harness.process import wait_until
from tests.integration.brokerutil import connect, produce, read_partition

BROKER = {"message.max.decompressed.bytes": 1 << 20}


def wrapper(value: bytes, codec: int = 1) -> bytes:
    """A well-formed entry (good CRC) whose value claims to be compressed with `codec`."""
    out = bytearray()
    append_entry(out, value, None, 1000, codec)
    return bytes(out)


def flipped_attributes(bit: int) -> bytes:
    data = bytearray(encode_message_set([(None, b"innocent", 1000)]))
    data[5] ^= bit
    return bytes(data)


def bad_crc_inner_set() -> bytes:
    inner = bytearray(encode_message_set([(None, b"inner-%d" % i, 1000) for i in range(3)]))
    inner[-1] ^= 0xFF
    return gzip.compress(bytes(inner))


POISONS = {
    "not gzip": lambda: wrapper(b"this value is not gzip at all"),
    "gzip of garbage": lambda: wrapper(gzip.compress(b"\x00\x00\x00\x40" + b"garbage!" * 20)),
    "gzip of inner set with bad CRC": lambda: wrapper(bad_crc_inner_set()),
    "flipped attribute bit 0": lambda: flipped_attributes(0x01),
    "flipped attribute bit 6": lambda: flipped_attributes(0x40),
    "gzip bomb": lambda: wrapper(gzip.compress(encode_message_set([(None, b"\0" * (8 << 20), 1000)]))),
    "lz4 bomb": lambda: wrapper(lz4.frame.compress(encode_message_set([(None, b"\0" * (8 << 20), 1000)])), 3),
    "lz4 frame with bytes after it": lambda: wrapper(lz4.frame.compress(encode_message_set(
        [(None, b"inner", 1000)])) + encode_message_set([(None, b"smuggled", 1000)]), 3),
    "snappy bomb in xerial framing": lambda: wrapper(aiokafka_snappy(encode_message_set(
        [(None, b"\0" * (8 << 20), 1000)])), 2),
    "xerial snappy block cut short": lambda: wrapper(aiokafka_snappy(encode_message_set(
        [(None, b"inner", 1000)]))[:-3], 2),
}


def test_every_poison_is_refused_with_invalid_message_and_the_log_stays_intact(cluster):
    broker = cluster.start_broker(0, BROKER)
    refused = {}
    with connect(broker) as conn:
        conn.create_topic("poison", 1)
        produce(conn, "poison", 0, [b"before"])
        for name, make in POISONS.items():
            with pytest.raises(InvalidMessage) as info:
                conn.produce("poison", 0, make(), acks=1)
            refused[name] = str(info.value)
        produce(conn, "poison", 0, [b"after"])
        assert [m.value for m in read_partition(conn, "poison", 0)] == [b"before", b"after"]
    segment = next((broker.log_dir / "poison-0").glob("*.kafka")).read_bytes()
    assert scan(segment).error is None and scan(segment).count == 2
    print("\npoisoned produces refused with code 2:", len(refused), "of", len(POISONS))
    for name, reason in refused.items():
        print(f"  {name}: {reason}")
    assert "decompresses to more than" in refused["gzip bomb"]
    assert "decompresses to more than" in refused["lz4 bomb"]
    assert "after its frame" in refused["lz4 frame with bytes after it"]
    assert "declares more than" in refused["snappy bomb in xerial framing"]
    assert "is cut" in refused["xerial snappy block cut short"]
    assert "CRC mismatch" in refused["gzip of inner set with bad CRC"]


def test_fetch_inside_a_message_is_an_invalid_request_in_version_0_and_the_next_entry_in_version_1(cluster):
    """Version 0 reads at entry boundaries only; version 1 answers any offset, and an
    offset past a plain entry's one record starts at the next entry (docs/protocol.md)."""
    broker = cluster.start_broker(0)
    with connect(broker) as conn:
        conn.create_topic("bounds", 1)
        produce(conn, "bounds", 0, [b"x" * 100, b"y" * 100])
        with pytest.raises(InvalidRequest, match="not a message boundary"):
            conn.call(ApiKey.FETCH, FetchRequest("bounds", 0, 7, 1000).encode(), 0)
        inside = conn.fetch("bounds", 0, 7, 1000)
        assert (inside.set_offset, len(inside.messages)) == (122, 122)
        assert len(conn.fetch("bounds", 0, 122, 1000).messages) == 122


# ---------------------------------------------------------------- a partition holding bad entries


def poisoned_partition(cluster, topic: str = "mixed"):
    """A partition [a0 a1 a2][bad CRC][b0][gzip of garbage][c0 c1] + [d0] produced after a
    restart. Returns (broker, good values in order, offsets of the two bad entries)."""
    broker = cluster.start_broker(0)
    with connect(broker) as conn:
        conn.create_topic(topic, 1)
        produce(conn, topic, 0, [b"a0", b"a1", b"a2"])
    broker.stop()  # clean: the next start trusts the segment as it is
    segment = next((broker.log_dir / f"{topic}-0").glob("*.kafka"))
    bad_crc = bytearray(encode_message_set([(None, b"bit rot", 1000)]))
    bad_crc[-2] ^= 0x10
    with open(segment, "ab") as f:
        first_bad = f.tell()
        f.write(bad_crc)
        f.write(encode_message_set([(None, b"b0", 1000)]))
        second_bad = f.tell()
        f.write(wrapper(gzip.compress(b"not an inner set")))
        f.write(encode_message_set([(None, b"c0", 1000), (None, b"c1", 1000)]))
    cluster.start_broker(0)
    with connect(broker) as conn:
        produce(conn, topic, 0, [b"d0"])
    return broker, [b"a0", b"a1", b"a2", b"b0", b"c0", b"c1", b"d0"], [first_bad, second_bad]


def test_simple_consumer_raises_at_a_bad_entry_after_the_good_ones_and_seeks_past_it(cluster, zk_connect):
    broker, good, bad = poisoned_partition(cluster)
    got, errors = [], []
    with SimpleConsumer("mixed", 0, zookeeper=zk_connect, offset=0, max_wait_ms=50) as consumer:
        for _ in range(len(bad) + 1):
            try:
                for message in consumer:
                    got.append(message.value)
                break
            except CorruptMessageError as exc:
                errors.append(exc)
                consumer.seek(exc.next_offset)
    assert got == good
    assert [e.offset for e in errors] == bad
    assert "mixed-0 at offset %d" % bad[0] in str(errors[0])
    print(f"\nSimpleConsumer(on_corrupt=raise): {len(got)} good messages, {len(errors)} corrupt entries raised")


def test_simple_consumer_skips_bad_entries_with_on_corrupt_skip(cluster, zk_connect):
    broker, good, bad = poisoned_partition(cluster)
    with SimpleConsumer("mixed", 0, zookeeper=zk_connect, offset=0, max_wait_ms=50, on_corrupt="skip") as consumer:
        got = [m.value for m in consumer]
        assert consumer.skipped == len(bad)
    assert got == good
    assert "skipping" not in broker.log_tail(200)  # the broker has nothing to say about it; the client logs it


def test_consumer_group_skips_bad_entries_and_delivers_the_rest(cluster, zk_connect):
    broker, good, bad = poisoned_partition(cluster)
    group = ConsumerGroup("readers", {"mixed": 1}, zk_connect, consumer_timeout_ms=200, max_wait_ms=100,
                          rebalance_backoff_ms=100)
    got: list[bytes] = []
    try:
        stream = group.streams["mixed"][0]

        def everything() -> bool:
            try:
                for message in stream:
                    got.append(message.value)
            except Exception:  # ConsumerTimeout: nothing more for now
                pass
            return len(got) >= len(good)

        wait_until(everything, 60, "every good message through the group")
        assert got == good
        assert group.fetcher.skipped == {("mixed", 0): len(bad)}
    finally:
        group.close()
    print(f"\nconsumer group: {len(got)} good messages delivered, {group.fetcher.skipped_entries} corrupt entries skipped")


def test_simple_consumer_batches_raise_at_a_bad_entry_as_iteration_does(cluster, zk_connect):
    broker, good, bad = poisoned_partition(cluster)
    got, errors = [], []
    with SimpleConsumer("mixed", 0, zookeeper=zk_connect, offset=0, max_wait_ms=50) as consumer:
        for _ in range(len(bad) + 1):
            try:
                for columns in consumer.batches(idle_timeout=0):
                    got += columns.values()
                break
            except CorruptMessageError as exc:
                errors.append(exc)
                consumer.seek(exc.next_offset)
    assert got == good
    assert [e.offset for e in errors] == bad
    with SimpleConsumer("mixed", 0, zookeeper=zk_connect, offset=0, max_wait_ms=50, on_corrupt="skip") as consumer:
        assert [v for columns in consumer.batches(idle_timeout=0) for v in columns.values()] == good
        assert consumer.skipped == len(bad)


def test_consumer_group_batches_skip_bad_entries_as_iteration_does(cluster, zk_connect):
    broker, good, bad = poisoned_partition(cluster)
    group = ConsumerGroup("batch-readers", {"mixed": 1}, zk_connect, consumer_timeout_ms=200, max_wait_ms=100,
                          rebalance_backoff_ms=100)
    got: list[bytes] = []
    try:
        stream = group.streams["mixed"][0]

        def everything() -> bool:
            try:
                for batch in stream.batches():
                    got.extend(batch.columns.values())
            except Exception:  # ConsumerTimeout: nothing more for now
                pass
            return len(got) >= len(good)

        wait_until(everything, 60, "every good message through the group's batches")
        assert got == good
        assert group.fetcher.skipped == {("mixed", 0): len(bad)}
    finally:
        group.close()
