import gzip

import pytest

from broker.common.errors import InvalidMessage, MessageTooLarge
from broker.common.message import (
    HEADER_SIZE, Codec, CorruptEntry, ScanStop, decode_messages, encode_message_set, iter_messages, scan,
    validate_message_set,
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


def test_scan_says_why_it_stopped_as_a_kind_not_a_text():
    data = encode_message_set(entries(3))
    corrupt = bytearray(data)
    corrupt[-1] ^= 0xFF
    stops = {
        "whole": scan(data), "cut in an entry": scan(data[:-1]), "cut in a header": scan(data[: len(data) // 3 + 5]),
        "bad CRC": scan(corrupt), "impossible size": scan(b"\x00\x00\x00\x01" + data),
        "too large": scan(data, max_message_bytes=10),
    }
    assert {why: (r.stop, r.partial_tail, r.too_large) for why, r in stops.items()} == {
        "whole": (ScanStop.END, False, False), "cut in an entry": (ScanStop.PARTIAL, True, False),
        "cut in a header": (ScanStop.PARTIAL, True, False), "bad CRC": (ScanStop.INVALID, False, False),
        "impossible size": (ScanStop.INVALID, False, False), "too large": (ScanStop.TOO_LARGE, False, True),
    }
    assert stops["whole"].error is None and all(r.error for why, r in stops.items() if why != "whole")


def test_corrupt_payload_fails_crc():
    data = bytearray(encode_message_set(entries(2)))
    data[-1] ^= 0xFF
    with pytest.raises(InvalidMessage, match="CRC"):
        list(iter_messages(bytes(data), 0))
    assert scan(data).valid_bytes == len(data) // 2


def test_gzip_wrapper_gives_inner_message_i_the_wrapper_offset_plus_i():
    data = encode_message_set(entries(3), codec="gzip")
    messages = list(iter_messages(data, 64))
    assert [m.value for m in messages] == [b"A" * 10, b"B" * 10, b"C" * 10]
    assert [m.offset for m in messages] == [64, 65, 66]
    assert [m.next_offset for m in messages] == [65, 66, 64 + len(data)]


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

    from broker.common.message import checksum, crc32c

    for size in (0, 1, 7, 64, 200, 4099):
        data = os.urandom(size)
        assert checksum(data) == crc32c(data)
        assert checksum(memoryview(data)[1:]) == crc32c(data[1:])


def test_everything_works_on_the_crcmod_fallback(monkeypatch):
    import broker.common.message as message

    monkeypatch.setattr(message, "checksum", message.crc32c)
    data = encode_message_set(entries(5))
    assert scan(data).count == 5
    assert len(list(iter_messages(data, 0))) == 5
    corrupt = bytearray(data)
    corrupt[-1] ^= 1
    assert scan(corrupt).error.startswith("CRC mismatch")


# ------------------------------------------------------------------ magic 2: CRC covers magic and attributes


def _entry_v1(value: bytes, timestamp: int = 1, attributes: int = 0) -> bytes:
    """An entry as magic-1 writers made it: the CRC covers the bytes after the crc field only."""
    import struct

    from broker.common.message import crc32c

    covered = struct.pack(">qi", timestamp, -1) + value
    return struct.pack(">ibbI", len(covered) + 6, 1, attributes, crc32c(covered)) + covered


def test_new_entries_are_magic_2():
    data = encode_message_set(entries(1))
    assert data[4] == 2


def test_crc_covers_magic_and_attributes():
    data = bytearray(encode_message_set(entries(1)))
    data[5] ^= 0x01  # "none" becomes "gzip": the CRC must notice
    assert scan(data).error.startswith("CRC mismatch")
    with pytest.raises(CorruptEntry, match="CRC mismatch"):
        list(iter_messages(bytes(data), 0))


def test_magic_1_entries_are_still_read_and_accepted():
    data = _entry_v1(b"old") + encode_message_set([(None, b"new", 2)])
    assert validate_message_set(data, 1000).count == 2
    assert [(m.value, m.timestamp) for m in iter_messages(data, 0)] == [(b"old", 1), (b"new", 2)]


# ------------------------------------------------------------------ compressed entries are opened at produce time


def _wrapper(value: bytes, codec: int = 1) -> bytes:
    from broker.common.message import append_entry

    out = bytearray()
    append_entry(out, value, None, 1, codec)
    return bytes(out)


def test_validate_refuses_a_gzip_entry_that_is_not_gzip():
    with pytest.raises(InvalidMessage, match="cannot decompress a gzip entry"):
        validate_message_set(_wrapper(b"plain text, not gzip"), 1 << 20)


def test_validate_refuses_gzip_of_garbage():
    with pytest.raises(InvalidMessage, match="gzip entry at byte 0: its inner set is invalid"):
        validate_message_set(_wrapper(gzip.compress(b"\x00\x00\x00\x30" + b"garbage" * 10)), 1 << 20)


def test_validate_refuses_gzip_of_an_inner_set_with_a_bad_crc():
    inner = bytearray(encode_message_set(entries(2)))
    inner[-1] ^= 0xFF
    with pytest.raises(InvalidMessage, match="inner set is invalid: CRC mismatch"):
        validate_message_set(_wrapper(gzip.compress(bytes(inner))), 1 << 20)


def test_validate_refuses_a_gzip_bomb():
    bomb = _wrapper(gzip.compress(encode_message_set([(None, b"\0" * (4 << 20), 1)])))
    assert len(bomb) < 10_000
    with pytest.raises(InvalidMessage, match="decompresses to more than 1048576 bytes"):
        validate_message_set(bomb, 1 << 20, max_decompressed_bytes=1 << 20)


def test_validate_refuses_nested_compression():
    inner = encode_message_set(entries(2), codec="gzip")
    with pytest.raises(InvalidMessage, match="nesting is not allowed"):
        validate_message_set(_wrapper(gzip.compress(inner)), 1 << 20)


def test_validate_accepts_good_compressed_sets():
    data = encode_message_set(entries(3), codec="gzip") + encode_message_set(entries(2))
    assert validate_message_set(data, 1 << 20).compressed == 1


# ------------------------------------------------------------------ readers step past what they cannot decode


def test_decode_returns_the_good_messages_before_a_corrupt_entry():
    good = encode_message_set(entries(2))
    bad = bytearray(encode_message_set([(None, b"bad", 5)]))
    bad[-1] ^= 0xFF
    after = encode_message_set([(None, b"after", 6)])
    data = good + bytes(bad) + after
    messages, corrupt = decode_messages(data, 100)
    assert [m.value for m in messages] == [b"A" * 10, b"B" * 10]
    assert corrupt.offset == 100 + len(good)
    assert corrupt.next_offset == 100 + len(good) + len(bad)
    assert [m.value for m in iter_messages(data[corrupt.next_offset - 100 :], corrupt.next_offset)] == [b"after"]


def test_a_wrapper_holding_garbage_is_a_corrupt_entry_with_a_way_past_it():
    data = _wrapper(gzip.compress(b"garbage" * 10))
    messages, corrupt = decode_messages(data, 0)
    assert messages == []
    assert "gzip value" in corrupt.reason
    assert corrupt.next_offset == len(data)


def test_an_impossible_size_gives_no_way_past():
    messages, corrupt = decode_messages(b"\x00\x00\x00\x01" + b"\x02" * 30, 0)
    assert corrupt is not None and corrupt.next_offset is None
