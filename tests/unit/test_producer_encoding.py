"""The producer's encoders (`encode_message_set`, `encode_batch`): a batch built in one
pass is byte for byte the entries of the message format, decodes to exactly the
messages sent, for every codec, with and without idempotence; and a compressed batch
that would span fewer bytes than it holds messages goes uncompressed."""

from __future__ import annotations

import random
import struct

import pytest

from broker.client.pipeline import Outgoing, Pipeline
from broker.common.compression import Codec
from broker.common.message import (
    HEADER, MAGIC_BATCH, BatchIdentity, append_entry, batch_identity, encode_batch, encode_message_set, iter_messages,
    now_ms, validate_message_set,
)
from broker.common.protocol import ProduceRequest

PACKAGES = {Codec.SNAPPY: "cramjam", Codec.LZ4: "lz4.frame", Codec.ZSTD: "zstandard"}


def installed(codec: Codec) -> Codec:
    if codec in PACKAGES:
        pytest.importorskip(PACKAGES[codec])
    return codec


def messages(seed: int, count: int) -> list[tuple[bytes | None, bytes, int]]:
    """Keys absent, empty and present; values empty to 1 KiB; timestamps in any order."""
    rng = random.Random(seed)
    return [(rng.choice([None, b"", b"key-%d" % i]), rng.randbytes(rng.choice([0, 1, 200, 1024])),
             rng.randrange(1 << 45)) for i in range(count)]


def entry_by_entry(records) -> bytes:
    """The reference: each message appended on its own, as the format defines it."""
    out = bytearray()
    for key, value, timestamp in records:
        append_entry(out, value, key, timestamp)
    return bytes(out)


@pytest.mark.parametrize("count", [1, 2, 50, 1000])
def test_an_uncompressed_set_is_byte_for_byte_the_entries_one_by_one(count):
    records = messages(count, count)
    assert encode_message_set(records) == entry_by_entry(records)


@pytest.mark.parametrize("seed", range(12))
def test_a_set_of_one_message_is_byte_for_byte_its_entry(seed):
    """Batch 1's own path (no list, no join): keys absent, empty and present, values
    empty to 1 KiB, and a message without a timestamp (stamped now, as the others)."""
    records = messages(seed, 1)
    assert encode_message_set(records) == entry_by_entry(records)
    key, value, _ = records[0]
    [message] = iter_messages(encode_message_set([(key, value, None)]), 0)
    assert (message.key, message.value) == (key, value)
    assert abs(message.timestamp - now_ms()) < 60_000


@pytest.mark.parametrize("count", [1, 50, 1000])
def test_an_uncompressed_batch_is_one_magic_3_entry_around_the_same_entries(count):
    records = messages(count, count)
    identity = BatchIdentity(42, 3, 1000, count)
    batch = encode_batch(records, identity)
    reference = bytearray()
    append_entry(reference, struct.pack(">qhii", *identity) + entry_by_entry(records), None,
                 max(t for _, _, t in records), 0, MAGIC_BATCH)
    assert batch == bytes(reference)
    assert batch_identity(batch) == identity


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("count", [1, 50, 700])
def test_a_batch_decodes_to_exactly_the_messages_sent(codec, idempotent, count):
    installed(codec)
    records = messages(count * 7 + int(codec), count)
    if idempotent:
        payload = encode_batch(records, BatchIdentity(9, 0, 5, count), codec)
    else:
        payload = encode_message_set(records, codec)
    result = validate_message_set(payload, 1 << 22)
    assert result.records == count
    decoded = list(iter_messages(payload, 1000))
    assert [(m.key, m.value, m.timestamp) for m in decoded] == records
    assert len({m.offset for m in decoded}) == count


def test_a_batch_takes_its_messages_from_any_iterable_and_refuses_a_count_it_does_not_hold():
    """The sender hands `encode_batch` a batch's messages as an iterator (`zip` over
    its flat fields): the count it encoded is checked against the identity's."""
    records = messages(3, 5)
    assert encode_batch(iter(records), BatchIdentity(9, 0, 5, 5)) == encode_batch(records, BatchIdentity(9, 0, 5, 5))
    with pytest.raises(ValueError, match="a batch of 5 messages cannot carry count 6"):
        encode_batch(iter(records), BatchIdentity(9, 0, 5, 6))
    with pytest.raises(ValueError, match="a batch of 0 messages cannot carry count 0"):
        encode_batch(iter(()), BatchIdentity(9, 0, 5, 0))


def sharing_timestamps(seed: int, count: int) -> list[tuple[bytes | None, bytes, int]]:
    """What a producer's batch looks like: runs of messages in one millisecond, keys
    absent, empty or of changing lengths within a run (the encoder reuses a header
    tail's CRC while timestamp and key length stay, and must notice each change)."""
    rng = random.Random(seed)
    stamp, records = 1_700_000_000_000, []
    for i in range(count):
        stamp += rng.choice([0, 0, 0, 1, -1])
        key = rng.choice([None, None, b"", b"k", b"k" * rng.randrange(2, 9)])
        records.append((key, rng.randbytes(rng.choice([0, 1, 200])), stamp))
    return records


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize("codec", list(Codec))
def test_messages_sharing_timestamps_encode_as_entries_one_by_one(codec, idempotent):
    installed(codec)
    for seed in range(20):
        records = sharing_timestamps(seed, 60)
        assert encode_message_set(records) == entry_by_entry(records)
        payload = (encode_batch(records, BatchIdentity(9, 0, 5, 60), codec) if idempotent
                   else encode_message_set(records, codec))
        decoded = list(iter_messages(payload, 0))
        assert [(m.key, m.value, m.timestamp) for m in decoded] == records
        assert HEADER.unpack_from(payload)[4] == max(t for _, _, t in records) or not codec and not idempotent


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.ZSTD])
@pytest.mark.parametrize("idempotent", [False, True])
def test_a_set_that_compresses_below_its_message_count_goes_uncompressed(codec, idempotent):
    """3,000 alike empty messages compress to a few dozen bytes: as one compressed
    entry their offsets (position + index) would run into the next entry's, and the
    broker refuses it. The encoders send them uncompressed; a batch keeps its identity."""
    installed(codec)
    records = [(None, b"", 1)] * 3000
    identity = BatchIdentity(9, 2, 77, 3000)
    payload = encode_batch(records, identity, codec) if idempotent else encode_message_set(records, codec)
    validate_message_set(payload, 1 << 22)  # the broker's check: raised InvalidMessage before the fix
    attributes = HEADER.unpack_from(payload)[2]
    assert attributes == 0
    if idempotent:
        assert batch_identity(payload) == identity
    else:
        assert payload == entry_by_entry(records)
    assert [m.value for m in iter_messages(payload, 0)] == [b""] * 3000


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.ZSTD])
def test_a_set_that_compresses_well_enough_stays_compressed(codec):
    installed(codec)
    records = [(None, b"x" * 200, 1)] * 50
    for payload in (encode_message_set(records, codec), encode_batch(records, BatchIdentity(1, 0, 0, 50), codec)):
        assert HEADER.unpack_from(payload)[2] == int(codec)
        assert len(payload) >= 50


@pytest.mark.parametrize("acks", [0, 1, -1])
def test_a_produce_request_built_from_its_cached_head_is_the_protocols_encoding(acks):
    """The pipeline encodes a partition's PRODUCE fields once and puts each set behind
    them: byte for byte what `ProduceRequest.encode` gives, for every batch."""
    pipeline = Pipeline(pool=None, acks=acks, timeout_ms=1234)
    for topic, partition, payload in [("clicks", 0, b""), ("clicks", 0, b"x" * 300), ("clicks", 3, b"y"),
                                      ("é-topic", 0, encode_message_set(messages(1, 5)))]:
        request = pipeline._produce(Outgoing(None, topic, partition, 0, payload), acks)
        assert b"".join(request.body) == ProduceRequest(acks, 1234, topic, partition, payload).encode()
        assert request.size == len(b"".join(request.body))


@pytest.mark.parametrize("acks", [0, 1])
def test_a_one_partition_round_is_a_produce_per_batch_in_order_each_the_protocols_encoding(acks):
    """Batch 1's path: every batch of a round to one partition shares one head, each
    its own PRODUCE, in the order given; several partitions take the rounds of k-th
    batches (a MULTIPRODUCE when more than one)."""
    pipeline = Pipeline(pool=None, acks=acks, timeout_ms=99)
    payloads = [encode_message_set(messages(seed, 1)) for seed in range(5)] + [b"z" * 70_000]
    outs = [Outgoing(i, "one", 2, 0, p) for i, p in enumerate(payloads)]
    requests = pipeline._requests(outs, acks)
    assert [r.parts[0].batch for r in requests] == list(range(6))
    for request, payload in zip(requests, payloads):
        assert b"".join(request.body) == ProduceRequest(acks, 99, "one", 2, payload).encode()
        assert request.size == len(b"".join(request.body))
    mixed = pipeline._requests([Outgoing("a0", "one", 0, 0, b"a"), Outgoing("b0", "one", 1, 0, b"b"),
                                Outgoing("a1", "one", 0, 0, b"c")], acks)
    assert [[p.batch for p in r.parts] for r in mixed] == [["a0", "b0"], ["a1"]]
