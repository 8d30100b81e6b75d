"""RECORD_COUNT's answer from one log (`Log.record_count`): the records whose offsets lie
in a range, any record's offset at either end, clamped to what the log holds — checked
against a count of every record's offset (docs/architecture.md, "Offsets")."""

from __future__ import annotations

import itertools

import pytest

from broker.common.errors import OffsetOutOfRange
from broker.common.message import BatchIdentity, Codec, encode_batch, encode_message_set, iter_messages
from broker.server.log.log import Log, LogConfig


def mixed_sets() -> list[bytes]:
    """Plain entries, producer batches (plain and zstd), gzip sets, a multi-entry set."""
    return [
        encode_message_set([(None, b"plain-0", 1)]),
        encode_batch([(None, b"b%d" % i, 2) for i in range(5)], BatchIdentity(7, 0, 0, 5)),
        encode_message_set([(None, b"g%d" % i, 3) for i in range(4)], Codec.GZIP),
        encode_message_set([(b"k", b"several-%d" % i, 4) for i in range(3)]),
        encode_batch([(None, b"z%d" % i, 5) for i in range(6)], BatchIdentity(7, 0, 5, 6), Codec.ZSTD),
        encode_message_set([(None, b"plain-1", 6)]),
    ]


def fill(log: Log, sets: list[bytes]) -> bytes:
    for data in sets:
        log.append(data, len(list(iter_messages(data, 0))), 0, 0)
    log.flush()
    return b"".join(sets)


def brute_count(offsets: list[int], start: int, end: int) -> int:
    return sum(start <= o < end for o in offsets)


@pytest.fixture
def log(tmp_path):
    log = Log(tmp_path / "t-0", "t", 0, LogConfig(segment_bytes=200))  # several segments
    yield log
    log.close()


def test_the_count_between_any_two_offsets_is_the_records_between_them(log):
    data = fill(log, mixed_sets() * 2)
    offsets = [m.offset for m in iter_messages(data, 0)]
    assert len(log.segments) > 2, "the test needs ranges across segments"
    for start, end in itertools.combinations_with_replacement(range(0, len(data) + 1, 7), 2):
        assert log.record_count(start, end) == (brute_count(offsets, start, end), start, end), (start, end)
    assert log.record_count(0) == (len(offsets), 0, len(data))


def test_the_range_is_clamped_to_the_log_and_past_its_end_is_out_of_range(log):
    data = fill(log, mixed_sets())
    everything = len(list(iter_messages(data, 0)))
    assert log.record_count(5, len(data) + 1000) == (everything - 1, 5, len(data))  # end lowered to the visible end
    log.append(encode_message_set([(None, b"unflushed", 1)]), 1, 0, 0)
    assert log.record_count(0) == (everything, 0, len(data)), "unflushed records are not visible"
    assert log.record_count(log.end_offset) == (0, log.end_offset, log.end_offset)
    with pytest.raises(OffsetOutOfRange, match="past the end"):
        log.record_count(log.end_offset + 1)
