"""`decode_columns` gives exactly what the reference decoder, `iter_messages`, gives:
the same messages (offsets, next offsets, timestamps, keys, values), the same resume
point, and the same `CorruptEntry` — for magic 1 and 2, compressed wrappers and magic-3
producer batches, whole, cut short, and with any one byte damaged."""

from __future__ import annotations

import random

import pytest

from broker.common.columns import decode_columns, empty_columns
from broker.common.message import (
    HEADER, MAGIC_V1, SEEDS, BatchIdentity, Codec, CorruptEntry, Message, append_entry, checksum, decode_messages,
    encode_batch, encode_message_set,
)


def _messages(n: int, seed: int) -> list[tuple[bytes | None, bytes, int]]:
    rng = random.Random(seed)
    return [(None if rng.random() < 0.5 else b"k%d" % i, bytes(rng.randrange(256) for _ in range(rng.randrange(30))),
             1_700_000_000_000 + i) for i in range(n)]


def _v1(messages) -> bytes:
    out = bytearray()
    for key, value, timestamp in messages:
        append_entry(out, value, key, timestamp, magic=MAGIC_V1)
    return bytes(out)


def _mixed() -> bytes:
    """Every kind of entry a fetch can hold, one after the other."""
    return b"".join([
        encode_message_set(_messages(3, 1)),
        _v1(_messages(2, 2)),
        encode_message_set(_messages(4, 3), Codec.GZIP),
        encode_batch(_messages(5, 4), BatchIdentity(7, 0, 0, 5)),
        encode_batch(_messages(3, 5), BatchIdentity(7, 0, 5, 3), Codec.GZIP),
        encode_message_set(_messages(2, 6)),
    ])


def _same(buf: bytes, base: int = 4096, verify_crc: bool = True) -> None:
    expected, corrupt = decode_messages(buf, base, verify_crc)
    columns = decode_columns(buf, base, verify_crc)
    assert columns.messages() == expected
    assert len(columns) == len(expected)
    assert columns.next_offset == (expected[-1].next_offset if expected else base)
    if corrupt is None:
        assert columns.corrupt is None
    else:
        assert columns.corrupt is not None
        assert (columns.corrupt.offset, columns.corrupt.size, columns.corrupt.reason) == (
            corrupt.offset, corrupt.size, corrupt.reason)
        assert columns.next_offset == corrupt.offset


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.GZIP])
def test_a_producer_batch_decodes_to_its_messages_at_the_wrapper_offset_plus_their_index(codec):
    messages = _messages(6, 9)
    buf = encode_batch(messages, BatchIdentity(3, 1, 100, 6), codec)
    columns = decode_columns(buf, 1000)
    assert [(columns.key(i), columns.value(i), columns.timestamps[i]) for i in range(len(columns))] == messages
    assert list(columns.offsets) == [1000 + i for i in range(6)]
    assert list(columns.next_offsets) == [1001 + i for i in range(5)] + [1000 + len(buf)]
    assert columns.next_offset == 1000 + len(buf) and columns.corrupt is None


def test_every_kind_of_entry_decodes_as_the_reference_does():
    buf = _mixed()
    _same(buf)
    assert len(decode_columns(buf, 0)) == 19


def test_a_fetch_cut_anywhere_decodes_as_the_reference_does():
    buf = _mixed()
    for cut in range(len(buf)):
        _same(buf[:cut])


@pytest.mark.parametrize("verify_crc", [True, False])
def test_any_damaged_byte_decodes_as_the_reference_does(verify_crc):
    buf = _mixed()
    rng = random.Random(25)
    for pos in range(len(buf)):
        damaged = bytearray(buf)
        damaged[pos] ^= 1 << rng.randrange(8)
        _same(bytes(damaged), verify_crc=verify_crc)


def test_a_batch_whose_count_lies_is_the_reference_corrupt_entry():
    good = encode_batch(_messages(3, 1), BatchIdentity(1, 0, 0, 3))
    lying = bytearray(good)
    lying[36:40] = (4).to_bytes(4, "big")  # the count field, after producer id, epoch and base sequence
    _, magic, attributes, _, _, _ = HEADER.unpack_from(lying, 0)
    lying[6:10] = checksum(lying[10:], SEEDS[magic][attributes]).to_bytes(4, "big")  # a CRC that covers the lie
    columns = decode_columns(bytes(lying), 0)
    assert len(columns) == 0 and isinstance(columns.corrupt, CorruptEntry)
    assert "count field says 4" in columns.corrupt.reason
    _same(bytes(lying))


def test_values_and_keys_come_back_as_bytes_in_order():
    messages = _messages(50, 3)
    columns = decode_columns(encode_message_set(messages), 0)
    assert columns.keys() == [m[0] for m in messages]
    assert columns.values() == [m[1] for m in messages]
    assert list(columns.timestamps) == [m[2] for m in messages]


def test_tail_is_the_rest_of_the_messages():
    columns = decode_columns(_mixed(), 10)
    assert columns.tail(7).messages() == columns.messages()[7:]
    assert columns.tail(7).next_offset == columns.next_offset


def test_empty_columns_resume_where_they_were_asked():
    columns = empty_columns(77)
    assert len(columns) == 0 and columns.next_offset == 77 and columns.messages() == []


def test_a_message_built_by_the_fast_path_is_an_ordinary_message():
    m = decode_columns(encode_message_set([(b"k", b"v", 5)]), 0).messages()[0]
    assert m == Message(0, 24, 5, b"k", b"v") and hash(m) == hash(Message(0, 24, 5, b"k", b"v"))
    with pytest.raises(AttributeError):
        m.value = b"other"  # type: ignore[misc]
