"""Stored entries as Kafka reads them, and magic-4 entries as native readers read them
(docs/kafka.md, "Record batches").

A Kafka fetch of a region of the log sends each magic-4 entry's batch as stored (its
22-byte logbus header cut off: no per-record work) and converts each run of native
entries (magics 1-3) into one RecordBatch v2 whose record offsets are theirs
(offsetDelta = offset - the run's first offset: gaps are allowed, as in compacted
topics). Native readers read a magic-4 entry's records — offset, timestamp, key,
value, headers — with `read_records`.
"""

from __future__ import annotations

from typing import NamedTuple

from aiokafka.record._crecords.default_records import (  # type: ignore[import-not-found]
    DefaultRecordBatch, DefaultRecordBatchBuilder,
)

from broker.common.compression import DEFAULT_MAX_DECOMPRESSED, Codec, decompress
from broker.common.kafka.records import (
    BATCH_HEADER, BATCH_HEADER_SIZE, CODEC_BITS, MAGIC_KAFKA_BATCH, NO_PRODUCER, entry_batch, patch,
    uncompressed_batch,
)
from broker.common.message import (
    BATCH_FIELDS, HEADER, HEADER_SIZE, MAGIC_BATCH, MIN_ENTRY_SIZE, SIZE_FIELD, CorruptEntry,
    Message, kafka_entry_error,
)

Header = tuple[str, bytes | None]


class KafkaRecord(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]


def read_records(batch: bytes | memoryview,
                 max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED) -> list[KafkaRecord]:
    """The records of a stored (already validated) Kafka batch, offsets baseOffset +
    offsetDelta: what iter_messages and decode_columns yield for a magic-4 entry."""
    return [KafkaRecord(r.offset, r.timestamp, r.key, r.value, r.headers)
            for r in DefaultRecordBatch(_plain(batch, max_decompressed_bytes))]


def batch_timestamps(batch: bytes | memoryview, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED) -> list[int]:
    """Only the record timestamps of a stored Kafka batch — what the brokers' record
    counts need — without a record object of ours a record (issue 36's profile: the
    counting of a librdkafka producer's records cost the broker ~10x more through
    `read_records` and `Message`s)."""
    return [r.timestamp for r in DefaultRecordBatch(_plain(batch, max_decompressed_bytes))]


def _plain(batch: bytes | memoryview, max_decompressed_bytes: int) -> bytes:
    """The batch as bytes, its records uncompressed."""
    buf = bytes(batch)
    codec = BATCH_HEADER.unpack_from(buf, 0)[5] & CODEC_BITS
    if codec:
        buf = uncompressed_batch(buf, decompress(Codec(codec), memoryview(buf)[BATCH_HEADER_SIZE:],
                                                 max_decompressed_bytes))
    return buf


def kafka_records(view: memoryview, pos: int, entry_end: int, offset: int,
                  max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED) -> list[KafkaRecord]:
    """The records of the magic-4 entry at `pos` of a fetched set, which is at `offset`
    (record i's offset is offset + i: `check_batch` made offsetDelta i), or
    `CorruptEntry` with the reason. Its CRC is the caller's to check."""
    size, _, attributes, _, _, key_length = HEADER.unpack_from(view, pos)
    problem = kafka_entry_error(view, pos, size, attributes, key_length)
    if problem:
        raise CorruptEntry(offset, size, problem)
    try:
        return read_records(view[pos + HEADER_SIZE : entry_end], max_decompressed_bytes)
    except Exception as exc:  # InvalidMessage from the codecs, the C reader's CorruptRecordException
        raise CorruptEntry(offset, size, f"Kafka batch: {exc}") from None


def kafka_messages(view: memoryview, pos: int, entry_end: int, offset: int,
                   max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED) -> list[Message]:
    """`kafka_records` as `iter_messages` yields them, all or none: each next_offset the
    next record's, the last one's past the entry; a null value as b"" (Message.value is
    bytes), headers kept."""
    records = kafka_records(view, pos, entry_end, offset, max_decompressed_bytes)
    last = len(records) - 1
    return [Message(offset + i, offset + i + 1 if i < last else entry_end - pos + offset, r.timestamp, r.key,
                    b"" if r.value is None else r.value, tuple(r.headers)) for i, r in enumerate(records)]


def native_batch(records: list[tuple[int, int, bytes | None, bytes]]) -> bytes:
    """(offset, timestamp, key, value) of native records, in offset order, as one
    uncompressed RecordBatch v2 (no producer id) whose base offset is the first's."""
    base = records[0][0]
    builder = DefaultRecordBatchBuilder(2, 0, 0, NO_PRODUCER, -1, -1, 1 << 31)
    for offset, timestamp, key, value in records:
        builder.append(offset - base, timestamp, key, value, [])
    out = builder.build()
    patch(out, base, -1)
    return bytes(out)


def fetch_batches(region: bytes | memoryview, region_offset: int) -> list[bytes | memoryview]:
    """The whole entries at the front of a fetched region (at byte position
    `region_offset`) as Kafka record batches, in order; a partial last entry is left
    out, as the native fetch leaves it for the next request."""
    parts: list[bytes | memoryview] = []
    view = memoryview(region)
    pos, end, run_start = 0, len(view), -1
    while end - pos >= HEADER_SIZE:
        size, magic = HEADER.unpack_from(view, pos)[:2]
        entry_end = pos + SIZE_FIELD + size
        if size < MIN_ENTRY_SIZE or entry_end > end:
            break
        if magic == MAGIC_KAFKA_BATCH:
            if run_start >= 0:
                parts.append(_converted(view[run_start:pos], region_offset + run_start))
                run_start = -1
            parts.append(entry_batch(view, pos))
        elif run_start < 0:
            run_start = pos
        pos = entry_end
    if run_start >= 0:
        parts.append(_converted(view[run_start:pos], region_offset + run_start))
    return parts


def _converted(entries: memoryview, offset: int) -> bytes:
    """A run of native entries (validated when appended) as one batch: entries read in
    place, wrappers opened once; no Message objects, no CRC checks (the batch's own
    CRC, computed here, is what the Kafka client checks)."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, NO_PRODUCER, -1, -1, 1 << 31)
    unpack, append = HEADER.unpack_from, builder.append
    pos, end = 0, len(entries)
    while pos < end:
        size, magic, attributes, _, timestamp, key_length = unpack(entries, pos)
        entry_end = pos + SIZE_FIELD + size
        if attributes or magic == MAGIC_BATCH:
            start = pos + HEADER_SIZE + max(key_length, 0) + (BATCH_FIELDS.size if magic == MAGIC_BATCH else 0)
            inner = decompress(Codec(attributes), entries[start:entry_end]) if attributes else entries[start:entry_end]
            last, at, stop = entry_end - pos - 1, 0, len(inner)
            i = 0
            while at < stop:
                size, _, _, _, timestamp, key_length = unpack(inner, at)
                body = at + HEADER_SIZE + max(key_length, 0)
                key = bytes(inner[at + HEADER_SIZE : body]) if key_length >= 0 else None
                at += SIZE_FIELD + size
                append(pos + min(i, last), timestamp, key, bytes(inner[body:at]), [])  # record_offset
                i += 1
        else:
            body = pos + HEADER_SIZE + max(key_length, 0)
            key = bytes(entries[pos + HEADER_SIZE : body]) if key_length >= 0 else None
            append(pos, timestamp, key, bytes(entries[body:entry_end]), [])
        pos = entry_end
    out = builder.build()
    patch(out, offset, -1)
    return bytes(out)
