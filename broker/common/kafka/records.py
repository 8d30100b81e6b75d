"""Kafka's RecordBatch v2 on the produce path (docs/kafka.md, "Record batches"): the
broker's checks of a produced batch, and the magic-4 entry that stores it verbatim.

A batch on the wire (every integer big-endian; CRC-32C over attributes .. end, so
neither baseOffset nor partitionLeaderEpoch is covered and the broker may set them)::

    int64 baseOffset | int32 batchLength | int32 partitionLeaderEpoch | int8 magic=2
    | uint32 crc | int16 attributes | int32 lastOffsetDelta | int64 baseTimestamp
    | int64 maxTimestamp | int64 producerId | int16 producerEpoch | int32 baseSequence
    | int32 recordsCount | records (compressed with attributes' codec, or not)

Stored, it is the value of one logbus entry of magic 4 (22-byte header, attributes 0,
key_length -1, timestamp = the batch's maxTimestamp), its baseOffset set to the
entry's position P and its partitionLeaderEpoch to the leader's epoch: record i then
has offset P + offsetDelta = P + i (docs/architecture.md, "Offsets"), and a Kafka
fetch serves the stored batch by cutting the 22 bytes off (`broker.common.kafka.fetch`).

The record walk is aiokafka's C reader (0.3 us a record); a walk in Python costs
about ten times that (BENCHMARKS.md, "Kafka codecs").
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from aiokafka.record._crecords.default_records import DefaultRecordBatch  # type: ignore[import-not-found]

from broker.common.compression import DEFAULT_MAX_DECOMPRESSED, Codec, decompress
from broker.common.entry import HEADER, HEADER_SIZE, MAGIC_KAFKA, V4_SEEDS, BatchIdentity, checksum

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE = BATCH_HEADER.size  # 61
LENGTH_END = 12  # baseOffset and batchLength: the bytes before what batchLength counts
EPOCH_AT, MAGIC_AT, CRC_AT, ATTRIBUTES_AT = 12, 16, 17, 21
KAFKA_MAGIC = 2
MAGIC_KAFKA_BATCH = MAGIC_KAFKA  # the logbus entry that holds one Kafka batch
CODEC_BITS, TIMESTAMP_TYPE_BIT, TRANSACTIONAL_BIT, CONTROL_BIT = 0x07, 0x08, 0x10, 0x20
NO_PRODUCER = -1
_BASE_OFFSET = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_ENTRY_HEAD = struct.Struct(">ibbI")
_ENTRY_TAIL = struct.Struct(">qi")
_CRC = struct.Struct(">I")


class BatchRefused(ValueError):
    """A produced batch the broker does not append, and why. `corrupt`: the bytes are
    damaged or not a batch (Kafka's CORRUPT_MESSAGE, 2); `too_large`: over
    `message.max.bytes` (MESSAGE_TOO_LARGE, 10); otherwise a well-formed batch the
    broker refuses (INVALID_RECORD, 87)."""

    def __init__(self, reason: str, corrupt: bool = True, too_large: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.corrupt = corrupt and not too_large
        self.too_large = too_large


class ProducedBatch(NamedTuple):
    """What the broker learnt from a batch it accepts."""

    records: int
    codec: Codec
    max_timestamp: int
    identity: BatchIdentity | None  # None: not an idempotent producer's (producerId -1)
    store_decompressed: bool  # compressed into fewer bytes than records: breaks "span >= records"
    record_times: tuple[int, int]  # min, max of the records' timestamps as a reader decodes them (the log's tally)


def check_batch(batch: bytes | memoryview, max_bytes: int = 1 << 20,
                max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED) -> ProducedBatch:
    """The broker's checks of the one batch a produce request (v3+) carries for a
    partition: size, magic, CRC, attributes (no transactions, no control batches),
    count, lastOffsetDelta, and every record whole with offsetDelta 0..n-1."""
    size = len(batch)
    if size < BATCH_HEADER_SIZE:
        raise BatchRefused(f"a record batch needs {BATCH_HEADER_SIZE} bytes of header, got {size}")
    (_, length, _, magic, crc, attributes, last_delta, _, max_ts,
     producer_id, epoch, base_sequence, count) = BATCH_HEADER.unpack_from(batch, 0)
    if magic != KAFKA_MAGIC:
        raise BatchRefused(f"record batch magic {magic}: only magic 2 (Kafka 0.11+) is accepted")
    if length + LENGTH_END != size:
        raise BatchRefused(f"batchLength {length} says {length + LENGTH_END} bytes, the request holds {size}")
    if size > max_bytes:
        raise BatchRefused(f"a record batch of {size} bytes exceeds message.max.bytes={max_bytes}", too_large=True)
    if checksum(memoryview(batch)[ATTRIBUTES_AT:]) != crc:
        raise BatchRefused("record batch CRC mismatch")
    codec_bits = attributes & CODEC_BITS
    if codec_bits > Codec.ZSTD or attributes & ~0x3F:
        raise BatchRefused(f"record batch attributes {attributes:#x} name no known codec or flags")
    if attributes & (TRANSACTIONAL_BIT | CONTROL_BIT):
        raise BatchRefused("transactional and control batches are not supported (logbus has no transactions)",
                           corrupt=False)
    if count <= 0 or last_delta != count - 1:
        raise BatchRefused(f"record batch of recordsCount {count} has lastOffsetDelta {last_delta}; "
                           f"a produced batch's offset deltas run 0..recordsCount-1")
    codec = Codec(codec_bits)
    record_times = _walk(batch, codec, count, max_decompressed_bytes)
    identity = None if producer_id == NO_PRODUCER else BatchIdentity(producer_id, epoch, base_sequence, count)
    if identity is None and (epoch != -1 or base_sequence != -1):
        raise BatchRefused(f"a batch without producerId has producerEpoch {epoch}, baseSequence {base_sequence}")
    return ProducedBatch(count, codec, max_ts, identity, HEADER_SIZE + size < count, record_times)


def _walk(batch: bytes | memoryview, codec: Codec, count: int, max_decompressed_bytes: int) -> tuple[int, int]:
    """Every record decodes, offsetDelta i for record i, nothing after the last one
    (the C reader raises on bytes left after recordsCount records); returns the min and
    max of their timestamps (the header's maxTimestamp is the producer's word, and a
    minimum it does not carry)."""
    buf = bytes(batch)
    if codec is not Codec.NONE:  # bounded here, so the C reader never inflates a bomb
        try:
            records = decompress(codec, memoryview(buf)[BATCH_HEADER_SIZE:], max_decompressed_bytes)
        except Exception as exc:  # InvalidMessage (bounded, or undecodable) and codec errors
            raise BatchRefused(f"record batch does not decompress: {exc}") from None
        buf = uncompressed_batch(buf, records)
    reader = DefaultRecordBatch(buf)
    base, expected, low, high = reader.base_offset, 0, 1 << 62, -(1 << 62)
    try:
        for record in reader:
            if record.offset - base != expected:
                raise BatchRefused(f"record {expected} has offsetDelta {record.offset - base}, not {expected}")
            expected += 1
            timestamp = record.timestamp
            low, high = min(low, timestamp), max(high, timestamp)
    except BatchRefused:
        raise
    except Exception as exc:  # the C reader's CorruptRecordException, IndexError on truncation...
        raise BatchRefused(f"the batch does not decode after {expected} records: {exc}") from None
    if expected != count:
        raise BatchRefused(f"recordsCount says {count} records, the batch holds {expected}")
    return low, high


def uncompressed_batch(batch: bytes | memoryview, records: bytes) -> bytes:
    """`batch`'s header (codec bits cleared, batchLength fixed; CRC not recomputed)
    followed by `records`: what the C reader walks once the broker has decompressed
    them with its own bounded codecs."""
    head = bytearray(batch[:BATCH_HEADER_SIZE])
    struct.pack_into(">i", head, 8, BATCH_HEADER_SIZE - LENGTH_END + len(records))
    struct.pack_into(">h", head, ATTRIBUTES_AT, struct.unpack_from(">h", head, ATTRIBUTES_AT)[0] & ~CODEC_BITS)
    return bytes(head) + records


def decompressed_batch(batch: bytes | memoryview, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """`batch` (checked) with its records stored uncompressed: codec bits cleared,
    batchLength fixed and the CRC recomputed, a valid batch a Kafka client reads. What
    the broker stores when `ProducedBatch.store_decompressed` says the compressed batch
    spans fewer bytes than it holds records."""
    codec = Codec(BATCH_HEADER.unpack_from(batch, 0)[5] & CODEC_BITS)
    out = bytearray(uncompressed_batch(batch, decompress(codec, memoryview(batch)[BATCH_HEADER_SIZE:],
                                                         max_decompressed_bytes)))
    _CRC.pack_into(out, CRC_AT, checksum(memoryview(out)[ATTRIBUTES_AT:]))
    return bytes(out)


def patch(batch: bytearray | memoryview, base_offset: int, leader_epoch: int) -> None:
    """Set the fields the producer cannot know and the CRC does not cover."""
    _BASE_OFFSET.pack_into(batch, 0, base_offset)
    _EPOCH.pack_into(batch, EPOCH_AT, leader_epoch)


def kafka_entry(batch: bytes | memoryview, position: int, leader_epoch: int, max_timestamp: int) -> bytes:
    """The magic-4 entry that stores `batch` at byte position `position`: its
    baseOffset patched to `position`, its epoch to `leader_epoch`; the entry's CRC
    (magic-2 style, seeded with magic 4) covers the patched batch."""
    out = bytearray(HEADER_SIZE) + batch
    patch(memoryview(out)[HEADER_SIZE:], position, leader_epoch)
    _ENTRY_TAIL.pack_into(out, 10, max_timestamp, -1)
    _ENTRY_HEAD.pack_into(out, 0, len(out) - 4, MAGIC_KAFKA_BATCH, 0, checksum(memoryview(out)[10:], V4_SEEDS[0]))
    return bytes(out)


def entry_batch(entry: bytes | memoryview, pos: int = 0) -> memoryview:
    """The Kafka batch inside the magic-4 entry at `pos`: what a Kafka fetch sends."""
    size = HEADER.unpack_from(entry, pos)[0]
    return memoryview(entry)[pos + HEADER_SIZE : pos + 4 + size]
