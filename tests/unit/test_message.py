import pytest

from broker.errors import InvalidMessage, MessageTooLarge
from broker.message import (
    HEADER_SIZE, Codec, encode_message_set, iter_messages, scan, validate_message_set,
)


def entries(n, size=10, ts=1000):
    return [(None, bytes([65 + i % 26]) * size, ts + i) for i in range(n)]


def test_entry_overhead_is_22_bytes():
    data = encode_message_set([(None, b"x" * 200, 1)])
    assert len(data) == 200 + HEADER_SIZE == 222


def test_round_trip_keeps_key_value_timestamp():
    data = encode_message_set([(b"user-1", b"hello", 1234), (None, b"", 99)])
    messages = list(iter_messages(data, 500))
    assert [(m.key, m.value, m.timestamp) for m in messages] == [(b"user-1", b"hello", 1234), (None, b"", 99)]


def test_next_offset_is_offset_plus_4_plus_size():
    data = encode_message_set(entries(3, size=7))
    messages = list(iter_messages(data, 1000))
    for m in messages:
        size = int.from_bytes(data[m.offset - 1000 : m.offset - 1000 + 4], "big")
        assert m.next_offset == m.offset + 4 + size
    assert [m.offset for m in messages] == [1000, 1000 + 29, 1000 + 58]


def test_partial_tail_is_dropped():
    data = encode_message_set(entries(3))
    assert len(list(iter_messages(data[:-1], 0))) == 2
    assert list(iter_messages(data[:5], 0)) == []


def test_corrupt_payload_fails_crc():
    data = bytearray(encode_message_set(entries(2)))
    data[-1] ^= 0xFF
    with pytest.raises(InvalidMessage, match="CRC"):
        list(iter_messages(bytes(data), 0))
    assert scan(data).valid_bytes == len(data) // 2


def test_gzip_wrapper_addresses_inner_messages_by_wrapper_offset():
    data = encode_message_set(entries(3), codec="gzip")
    messages = list(iter_messages(data, 64))
    assert [m.value for m in messages] == [b"A" * 10, b"B" * 10, b"C" * 10]
    assert {m.offset for m in messages} == {64}
    assert [m.next_offset for m in messages] == [64, 64, 64 + len(data)]


def test_gzip_wrapper_timestamp_is_largest_inner():
    data = encode_message_set([(None, b"a", 5), (None, b"b", 9), (None, b"c", 7)], codec=Codec.GZIP)
    assert scan(data).max_timestamp == 9


def test_missing_optional_codec_library_is_a_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_lz4(name, *args, **kwargs):
        if name.startswith("lz4"):
            raise ImportError("no lz4 here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_lz4)
    with pytest.raises(InvalidMessage, match="needs the 'lz4' package"):
        encode_message_set(entries(1), codec="lz4")


def test_unknown_codec_name_is_rejected():
    with pytest.raises(ValueError, match="unknown compression codec 'brotli'"):
        Codec.parse("brotli")


def test_validate_rejects_garbage_and_empty_sets():
    with pytest.raises(InvalidMessage, match="empty"):
        validate_message_set(b"", 1000)
    with pytest.raises(InvalidMessage, match="impossible entry size"):
        validate_message_set(b"\x00\x00\x00\x01garbage-garbage-garbage", 1000)


def test_validate_rejects_message_over_max_bytes():
    data = encode_message_set([(None, b"x" * 500, 1)])
    with pytest.raises(MessageTooLarge, match="message.max.bytes=100"):
        validate_message_set(data, 100)


def test_scan_reports_count_and_timestamps():
    result = scan(encode_message_set(entries(4, ts=50)))
    assert (result.count, result.min_timestamp, result.max_timestamp, result.error) == (4, 50, 53, None)


def test_fast_checksum_agrees_with_crcmod():
    import os

    from broker.message import checksum, crc32c

    for size in (0, 1, 7, 64, 200, 4099):
        data = os.urandom(size)
        assert checksum(data) == crc32c(data)
        assert checksum(memoryview(data)[1:]) == crc32c(data[1:])


def test_everything_works_on_the_crcmod_fallback(monkeypatch):
    import broker.message as message

    monkeypatch.setattr(message, "checksum", message.crc32c)
    data = encode_message_set(entries(5))
    assert scan(data).count == 5
    assert len(list(iter_messages(data, 0))) == 5
    corrupt = bytearray(data)
    corrupt[-1] ^= 1
    assert scan(corrupt).error.startswith("CRC mismatch")
