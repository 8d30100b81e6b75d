"""snappy as Kafka's clients write it (docs/kafka.md, "Record batches"): raw blocks
(librdkafka, logbus's own producers) and xerial's framing of them (Kafka's Java
producer; kafka-python and aiokafka here, whose encoders are the reference), read with
a bound on the output that each block's declared length is checked against before the
library allocates it."""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from aiokafka.codec import snappy_encode as aiokafka_snappy
from kafka.codec import snappy_encode as kafka_python_snappy

from broker.common.compression import XERIAL_MAGIC, Codec, compress, decompress
from broker.common.errors import InvalidMessage

MiB = 1 << 20
RECORDS = b"".join(b"record %d of a batch, " % i for i in range(20_000))  # about 500 KiB: many xerial blocks


def xerial(*blocks: bytes, compatible: int = 1) -> bytes:
    return XERIAL_MAGIC + struct.pack(">ii", 1, compatible) + b"".join(struct.pack(">i", len(b)) + b for b in blocks)


@pytest.mark.parametrize("encode", [kafka_python_snappy, aiokafka_snappy], ids=["kafka-python", "aiokafka"])
def test_xerial_framing_from_the_python_kafka_clients_reads_back_exactly(encode):
    framed = encode(RECORDS)
    assert framed.startswith(XERIAL_MAGIC) and len(framed) < len(RECORDS) // 2
    assert decompress(Codec.SNAPPY, framed) == RECORDS
    assert decompress(Codec.SNAPPY, memoryview(framed)) == RECORDS  # as the broker hands a batch's body


def test_raw_snappy_round_trips_and_its_bound_is_exact():
    assert decompress(Codec.SNAPPY, compress(Codec.SNAPPY, RECORDS)) == RECORDS
    assert decompress(Codec.SNAPPY, compress(Codec.SNAPPY, b"x" * MiB), MiB) == b"x" * MiB
    with pytest.raises(InvalidMessage, match="declares more than 1048576 bytes"):
        decompress(Codec.SNAPPY, compress(Codec.SNAPPY, b"x" * (MiB + 1)), MiB)


def test_a_xerial_bomb_is_refused_without_allocating_what_it_holds():
    """64 MiB of zeros in 32 KiB blocks, about 3 MiB framed: refused at the block that
    would pass 1 MiB, before it is inflated."""
    bomb = aiokafka_snappy(bytes(64 * MiB))
    tracemalloc.start()
    try:
        with pytest.raises(InvalidMessage, match="declares more than 1048576 bytes"):
            decompress(Codec.SNAPPY, bomb, MiB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(bomb) + 4 * MiB, f"{peak / MiB:.0f} MiB allocated to refuse a bound of 1 MiB"


def test_one_xerial_block_declaring_four_gib_is_refused_before_the_library_reads_it():
    with pytest.raises(InvalidMessage, match="declares more than 1048576 bytes"):
        decompress(Codec.SNAPPY, xerial(b"\x80\x80\x80\x80\x10" + b"\x00" * 10), MiB)


def test_broken_xerial_framing_is_refused_with_its_reason():
    block = compress(Codec.SNAPPY, b"a record")
    with pytest.raises(InvalidMessage, match="truncated xerial header"):
        decompress(Codec.SNAPPY, xerial(block)[:12])
    with pytest.raises(InvalidMessage, match=f"a xerial block of {len(block)} bytes is cut"):
        decompress(Codec.SNAPPY, xerial(block)[:-1])
    with pytest.raises(InvalidMessage, match="truncated xerial block length"):
        decompress(Codec.SNAPPY, xerial(block) + b"\x00\x00")
    with pytest.raises(InvalidMessage, match="xerial framing version 2 is unknown"):
        decompress(Codec.SNAPPY, xerial(block, compatible=2))
    with pytest.raises(InvalidMessage, match="cannot decompress a snappy entry"):
        decompress(Codec.SNAPPY, xerial(b"\x05not snappy"))
    assert decompress(Codec.SNAPPY, xerial()) == b""  # no blocks: nothing, as xerial's reader says
