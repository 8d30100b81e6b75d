"""An entry's header (docs/protocol.md, "Message format"; broker/common/message.py
holds the layout, the codecs and the scanner): its fields, the magics and their
CRC-32C seeds, and the identity a producer batch (magic 3) or a Kafka batch (magic 4)
carries. Everything here is re-exported by `broker.common.message`; the Kafka codecs
(`broker.common.kafka`) import it from here, below the message codecs."""

from __future__ import annotations

import struct
import time
from typing import Callable, Iterator, NamedTuple

import crcmod.predefined

MAGIC = 2  # written: the CRC covers magic and attributes too
MAGIC_V1 = 1  # still read: the CRC covers the bytes after the crc field only
MAGIC_BATCH = 3  # an idempotent producer's batch: a wrapper carrying (producer id, epoch, sequence, count)
MAGIC_KAFKA = 4  # one Kafka RecordBatch v2, written by the broker's Kafka listener only
MAGICS = (MAGIC_V1, MAGIC, MAGIC_BATCH, MAGIC_KAFKA)
HEADER = struct.Struct(">ibbIqi")
HEADER_SIZE = HEADER.size  # 22: the per-message overhead
SIZE_FIELD = 4
CRC_END = 10  # bytes before the first CRC-covered byte after the crc field
MIN_ENTRY_SIZE = HEADER_SIZE - SIZE_FIELD  # value of `size` for an empty key and value
CODEC_MASK = 0x07
CODEC_MAX = 4  # zstd: the highest codec (broker.common.compression.Codec)

crc32c: Callable[[bytes | memoryview], int] = crcmod.predefined.mkCrcFun("crc-32c")  # the reference


def _fastest_crc32c() -> Callable[[bytes | memoryview], int]:
    """The CRC-32C every inner loop calls. crcmod computes it a byte at a time behind a
    Python wrapper (0.83 us for a 200-byte message, half of validating it); the
    `crc32c` package uses the CPU's CRC32 instruction (0.25 us) and takes memoryview
    slices. Used when installed and in agreement with crcmod on a test vector."""
    try:
        import crc32c as hardware  # type: ignore[import-not-found]

        if hardware.crc32c(b"123456789") == crc32c(b"123456789") == 0xE3069283:
            return hardware.crc32c
    except (ImportError, AttributeError):
        pass
    return crc32c


checksum = _fastest_crc32c()


# CRC-32C of the two bytes (magic, attributes), by attributes & 0xFF: a magic-2, -3 or -4
# CRC continues from one of these, so checking it costs one call over one slice, as
# magic 1 did.
V2_SEEDS = tuple(crc32c(bytes([MAGIC, a])) for a in range(256))
V3_SEEDS = tuple(crc32c(bytes([MAGIC_BATCH, a])) for a in range(256))
V4_SEEDS = tuple(crc32c(bytes([MAGIC_KAFKA, a])) for a in range(256))
SEEDS = {MAGIC_V1: (0,) * 256, MAGIC: V2_SEEDS, MAGIC_BATCH: V3_SEEDS, MAGIC_KAFKA: V4_SEEDS}


def entry_crc(view: memoryview, pos: int, entry_end: int, magic: int, attributes: int) -> int:
    """The CRC an entry at `pos` should carry, per its magic: magics 2, 3 and 4 cover
    magic, attributes and `[pos+10, entry_end)`; magic 1 only the latter."""
    return checksum(view[pos + CRC_END : entry_end], SEEDS[magic][attributes & 0xFF])


BATCH_FIELDS = struct.Struct(">qhii")  # producer_id, producer_epoch, base_sequence, count
BATCH_HEADER_SIZE = HEADER_SIZE + BATCH_FIELDS.size  # 40: a magic-3 entry's bytes before its inner set
# A Kafka batch's producerId, producerEpoch, baseSequence and recordsCount have BATCH_FIELDS'
# layout, 43 bytes into its 61-byte header (broker.common.kafka.records.BATCH_HEADER)
KAFKA_FIELDS_AT = HEADER_SIZE + 43
KAFKA_HEADER_SIZE = HEADER_SIZE + 61  # a magic-4 entry's bytes before the batch's records
FIELDS_AT = {MAGIC_BATCH: HEADER_SIZE, MAGIC_KAFKA: KAFKA_FIELDS_AT}  # where an entry's identity is, by magic
SEQUENCE_LIMIT = 1 << 31  # sequences wrap to 0 after 2**31 - 1, as Kafka's do


class BatchIdentity(NamedTuple):
    """Who wrote a magic-3 (or -4) batch and which of their messages it holds."""

    producer_id: int
    epoch: int
    base_sequence: int
    count: int

    @property
    def last_sequence(self) -> int:
        return (self.base_sequence + self.count - 1) % SEQUENCE_LIMIT


def batch_identity(buf: bytes | memoryview, pos: int = 0) -> BatchIdentity:
    """The identity fields of the magic-3 or -4 entry at `pos` (the caller knows it is
    one); a Kafka batch without a producer has producer_id -1."""
    return BatchIdentity._make(BATCH_FIELDS.unpack_from(buf, pos + FIELDS_AT[buf[pos + SIZE_FIELD]]))


def iter_batches(buf: bytes | memoryview) -> Iterator[tuple[int, int, BatchIdentity]]:
    """(position, end, identity) of every producer batch — magic 3, or magic 4 with a
    producerId — among the whole entries of a scanned buffer: what producer state learns
    from bytes already validated."""
    pos, end = 0, len(buf)
    unpack = HEADER.unpack_from
    while end - pos >= HEADER_SIZE:
        size, magic = unpack(buf, pos)[:2]
        entry_end = pos + SIZE_FIELD + size
        if size < MIN_ENTRY_SIZE or entry_end > end:
            return
        if magic == MAGIC_BATCH or magic == MAGIC_KAFKA:
            identity = batch_identity(buf, pos)
            if identity.producer_id != -1:
                yield pos, entry_end, identity
        pos = entry_end


def now_ms() -> int:
    return int(time.time() * 1000)


def kafka_entry_error(view: memoryview, pos: int, size: int, attributes: int, key_length: int) -> str | None:
    """Why the magic-4 entry at `pos` is malformed, before its CRC is checked (None if
    it is not): the header's fields as the broker writes them, its batch whole."""
    if attributes or key_length != -1 or size < KAFKA_HEADER_SIZE - SIZE_FIELD:
        return f"a Kafka batch entry at byte {pos} has attributes, a key or no room for a batch header"
    length, magic = struct.unpack_from(">ixxxxb", view, pos + HEADER_SIZE + 8)
    if length + 12 != size - MIN_ENTRY_SIZE or magic != 2:
        return f"a Kafka batch entry at byte {pos} holds a batch of magic {magic}, batchLength {length}"
    return None


def header_error(pos: int, magic: int, attributes: int, key_length: int, max_magic: int = MAGIC_KAFKA) -> str:
    """Why the header of the entry at `pos` is not one `scan` accepts, for a person."""
    if magic == MAGIC_KAFKA and max_magic < MAGIC_KAFKA:
        return (f"magic 4 at byte {pos}: a Kafka record batch is written only by the broker, from a batch "
                f"produced through its Kafka listener; a native PRODUCE sends magic 1-3")
    if magic not in MAGICS:
        return f"unknown magic {magic} at byte {pos}"
    if not 0 <= attributes <= CODEC_MAX:
        return f"unknown attributes {attributes:#x} at byte {pos}"
    return f"impossible key length {key_length} at byte {pos}"
