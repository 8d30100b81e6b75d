"""Magic 3, the idempotent producer's batch (docs/protocol.md, "Message format"): its
identity travels under the CRC, its count must be the truth, and it reads, validates
and scans next to magic 1 and 2 entries."""

import struct

import pytest

from broker.common.errors import InvalidMessage
from broker.common.message import (
    BATCH_HEADER_SIZE, MAGIC_BATCH, BatchIdentity, CorruptEntry, ScanStop, append_entry, batch_identity,
    encode_batch, encode_message_set, iter_batches, iter_messages, scan, validate_message_set,
)

MESSAGES = [(None, b"alpha", 10), (b"k", b"beta", 12), (None, b"gamma", 11)]
IDENTITY = BatchIdentity(producer_id=7_000_000_001, epoch=3, base_sequence=40, count=3)


@pytest.mark.parametrize("codec", [None, "gzip"])
def test_a_batch_reads_back_its_messages_at_the_wrapper_offset_plus_their_index(codec):
    batch = encode_batch(MESSAGES, IDENTITY, codec)
    assert batch[4] == MAGIC_BATCH and batch_identity(batch) == IDENTITY
    read = list(iter_messages(batch, 1000))
    assert [(m.key, m.value, m.timestamp) for m in read] == MESSAGES
    assert [m.offset for m in read] == [1000, 1001, 1002]
    assert [m.next_offset for m in read] == [1001, 1002, 1000 + len(batch)]
    assert validate_message_set(batch, 1 << 20).batches == 1


def test_the_last_sequence_wraps_like_kafkas():
    assert BatchIdentity(1, 0, (1 << 31) - 2, 4).last_sequence == 1
    assert IDENTITY.last_sequence == 42


def test_the_crc_covers_the_producer_fields():
    batch = bytearray(encode_batch(MESSAGES, IDENTITY))
    batch[BATCH_HEADER_SIZE - 10] ^= 0x01  # a bit of the base sequence
    assert scan(batch).stop is ScanStop.INVALID
    with pytest.raises(CorruptEntry, match="CRC"):
        list(iter_messages(batch, 0))


def _forged(count: int, inner: bytes, key: bytes | None = None) -> bytes:
    """A magic-3 entry with a valid CRC but a lying count or a key."""
    out = bytearray()
    fields = struct.pack(">qhii", 1, 0, 0, count)
    append_entry(out, fields + inner, key, 5, 0, MAGIC_BATCH)
    return bytes(out)


def test_a_count_that_is_not_the_inner_sets_is_refused():
    forged = _forged(5, encode_message_set(MESSAGES))
    with pytest.raises(InvalidMessage, match="count field says 5"):
        validate_message_set(forged, 1 << 20)
    with pytest.raises(CorruptEntry):
        list(iter_messages(forged, 0))


def test_a_batch_with_a_key_or_a_nested_wrapper_is_refused():
    assert scan(_forged(3, encode_message_set(MESSAGES), key=b"k")).stop is ScanStop.INVALID
    with pytest.raises(InvalidMessage, match="nesting"):
        validate_message_set(_forged(1, encode_batch(MESSAGES, IDENTITY)), 1 << 20)
    with pytest.raises(InvalidMessage, match="nesting"):
        validate_message_set(_forged(1, encode_message_set(MESSAGES, "gzip")), 1 << 20)


def test_old_magics_read_next_to_batches():
    v2 = encode_message_set([(None, b"old", 1)])
    v1 = bytearray(v2)
    v1[4] = 1  # magic 1: the CRC covers the bytes after the crc field only
    from broker.common.message import checksum
    struct.pack_into(">I", v1, 6, checksum(bytes(v1[10:])))
    mixed = bytes(v1) + encode_batch(MESSAGES, IDENTITY) + v2 + encode_batch(MESSAGES[:1], IDENTITY._replace(
        base_sequence=43, count=1), "gzip")
    result = validate_message_set(mixed, 1 << 20)
    assert (result.count, result.batches, result.compressed) == (4, 2, 1)
    assert [m.value for m in iter_messages(mixed, 0)] == [b"old", b"alpha", b"beta", b"gamma", b"old", b"alpha"]
    assert [identity.base_sequence for _, _, identity in iter_batches(mixed)] == [40, 43]


def test_a_batch_must_count_its_messages():
    with pytest.raises(ValueError, match="count 2"):
        encode_batch(MESSAGES, IDENTITY._replace(count=2))
