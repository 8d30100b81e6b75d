"""Decompression stops at its bound for every codec a hostile producer can choose: a
value of a few hundred KiB must not make the broker allocate what it holds
(docs/protocol.md, "Message format"). Memory is measured with tracemalloc, which sees
the codec libraries' allocations of Python objects."""

from __future__ import annotations

import tracemalloc

import pytest

from broker.common.compression import Codec, compress, decompress
from broker.common.errors import InvalidMessage

lz4_frame = pytest.importorskip("lz4.frame")

MiB = 1 << 20


def _peak_while(call) -> tuple[int, str]:
    """Bytes allocated at the peak while `call()` runs, and why it refused (it must
    raise InvalidMessage)."""
    tracemalloc.start()
    try:
        with pytest.raises(InvalidMessage) as refused:
            call()
        return tracemalloc.get_traced_memory()[1], str(refused.value)
    finally:
        tracemalloc.stop()


def test_an_lz4_bomb_is_refused_without_allocating_what_it_holds():
    bomb = lz4_frame.compress(bytes(64 * MiB))
    assert len(bomb) < MiB // 2
    peak, reason = _peak_while(lambda: decompress(Codec.LZ4, bomb, MiB))
    assert "decompresses to more than 1048576 bytes" in reason
    assert peak < 8 * MiB, f"{peak / MiB:.0f} MiB allocated to refuse a bound of 1 MiB"


def test_lz4_output_exactly_at_the_bound_is_accepted_and_one_byte_more_is_not():
    assert decompress(Codec.LZ4, compress(Codec.LZ4, b"x" * MiB), MiB) == b"x" * MiB
    with pytest.raises(InvalidMessage, match="more than 1048576 bytes"):
        decompress(Codec.LZ4, compress(Codec.LZ4, b"x" * (MiB + 1)), MiB)


def test_an_lz4_frame_cut_short_or_followed_by_bytes_is_refused_with_its_reason():
    frame = compress(Codec.LZ4, b"a record batch's records" * 100)
    with pytest.raises(InvalidMessage, match="truncated lz4 frame"):
        decompress(Codec.LZ4, frame[:-9])
    with pytest.raises(InvalidMessage, match="4 bytes after its frame"):  # lz4.frame.decompress dropped them
        decompress(Codec.LZ4, frame + b"more")
    with pytest.raises(InvalidMessage, match="lz4"):
        decompress(Codec.LZ4, b"not an lz4 frame at all")


def test_a_snappy_value_declaring_more_than_the_bound_is_refused_before_any_library_reads_it():
    """A raw snappy block starts with its uncompressed length, which the library
    allocates first: 4 GiB declared in five bytes."""
    with pytest.raises(InvalidMessage, match="declares more than 1048576 bytes"):
        decompress(Codec.SNAPPY, b"\x80\x80\x80\x80\x10" + b"\x00" * 10, MiB)
    with pytest.raises(InvalidMessage, match="no length in its header"):
        decompress(Codec.SNAPPY, b"\xff" * 6, MiB)
