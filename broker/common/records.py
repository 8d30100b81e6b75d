"""How many messages — so how many offsets — entries hold (docs/architecture.md,
"Offsets"): message i of the entry at position P has offset P + i, so an index of a
segment and a count of the records between two offsets (lag in records) need each
entry's count, which a producer batch carries in its header and a compressed set
only inside."""

from __future__ import annotations

import struct
from array import array
from typing import Callable

from broker.common.compression import DEFAULT_MAX_DECOMPRESSED, Codec, decompress
from broker.common.errors import InvalidMessage
from broker.common.message import (
    BATCH_FIELDS, CODEC_MASK, HEADER, HEADER_SIZE, MAGIC, MAGIC_BATCH, MAGIC_KAFKA, MAGIC_V1, MIN_ENTRY_SIZE,
    SIZE_FIELD, batch_identity, inner_set, iter_messages, kafka_entry_error,
)


def entry_records(buf: bytes | memoryview, pos: int = 0, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED) -> int:
    """The messages the valid entry at `pos` holds, so the offsets it takes: 1 for a
    plain entry, a producer or Kafka batch's count field (recordsCount: a Kafka batch
    is never opened here), a compressed set's inner entries
    (decompressed: only the writer's validation and an index build pay for it)."""
    size, magic, attributes = HEADER.unpack_from(buf, pos)[:3]
    if magic == MAGIC_BATCH or magic == MAGIC_KAFKA:
        return batch_identity(buf, pos).count
    if not attributes:
        return 1
    with memoryview(buf) as view:
        return inner_set(view, pos, pos + SIZE_FIELD + size, max_decompressed_bytes).count


def count_records(buf: bytes | memoryview, per_entry: Callable[[bytes | memoryview, int], int] = entry_records) -> int:
    """The messages in the whole entries at the front of `buf` (already validated),
    each entry counted by `per_entry` (the broker's index counts an unopenable set as
    none: `broker.server.log.index.readable_records`)."""
    records, pos, end = 0, 0, len(buf)
    while end - pos >= HEADER_SIZE:
        size = HEADER.unpack_from(buf, pos)[0]
        if size < MIN_ENTRY_SIZE or pos + SIZE_FIELD + size > end:
            break
        records += per_entry(buf, pos)
        pos += SIZE_FIELD + size
    return records


_ENTRY_TIME = struct.Struct(">ibb4xq")  # size, magic, attributes, (crc), timestamp
_INNER_TIME = struct.Struct(">i6xq")  # size, (magic, attributes, crc), timestamp


def _inner_bytes(view: memoryview, pos: int, entry_end: int, max_decompressed_bytes: int) -> bytes | memoryview:
    """A wrapper's inner set, decompressed, unchecked (`inner_set` checks it too, with
    a second walk that committed bytes do not need)."""
    key_length = HEADER.unpack_from(view, pos)[5]
    start = pos + HEADER_SIZE + max(key_length, 0) + (BATCH_FIELDS.size if view[pos + 4] == MAGIC_BATCH else 0)
    codec = view[pos + 5] & CODEC_MASK
    return decompress(Codec(codec), view[start:entry_end], max_decompressed_bytes) if codec else view[start:entry_end]


def record_timestamps(buf: bytes | memoryview, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED
                      ) -> tuple[array, int]:
    """The timestamp of every record in the whole entries at the front of `buf` (bytes
    a log committed: validated at append, so no CRC is checked), in order, and where the
    walk stopped — `len(buf)`, or the start of an entry it could not read (an impossible
    size, a value that does not decompress into whole entries). What the brokers' record
    counts need (`broker.common.auditcounts`), and only that: a header field a record,
    about twice as fast as decoding the messages. A stored Kafka batch (magic 4) gives
    its records' timestamps through aiokafka's reader (`batch_timestamps`); a magic
    this walk does not know is read by the reference decoder, `iter_messages`."""
    out = array("q")
    append = out.append
    view = memoryview(buf)
    pos, end = 0, len(view)
    entry, inner_time = _ENTRY_TIME.unpack_from, _INNER_TIME.unpack_from
    while end - pos >= HEADER_SIZE:
        size, magic, attributes, timestamp = entry(view, pos)
        entry_end = pos + SIZE_FIELD + size
        if size < MIN_ENTRY_SIZE or entry_end > end:
            break
        if magic == MAGIC_KAFKA:
            try:
                out.extend(_kafka_timestamps(view, pos, entry_end, max_decompressed_bytes))
            except Exception:  # InvalidMessage from the codecs, the C reader's CorruptRecordException
                break
        elif magic not in (MAGIC_V1, MAGIC, MAGIC_BATCH):
            try:
                out.extend(m.timestamp for m in iter_messages(view[pos:entry_end], pos, verify_crc=False))
            except InvalidMessage:
                break
        elif not attributes and magic != MAGIC_BATCH:
            append(timestamp)
        else:
            try:
                inner = _inner_bytes(view, pos, entry_end, max_decompressed_bytes)
            except (InvalidMessage, ValueError):
                break
            first, ipos, iend = len(out), 0, len(inner)
            while iend - ipos >= HEADER_SIZE:
                isize, its = inner_time(inner, ipos)
                if isize < MIN_ENTRY_SIZE:
                    break
                append(its)
                ipos += SIZE_FIELD + isize
            if ipos != iend:  # not whole entries: nothing of it is counted
                del out[first:]
                break
        pos = entry_end
    return out, pos


def _kafka_timestamps(view: memoryview, pos: int, entry_end: int, max_decompressed_bytes: int) -> list[int]:
    """A magic-4 entry's record timestamps (its structure checked as `iter_messages`
    checks it, no CRC)."""
    from broker.common.kafka.fetch import batch_timestamps  # noqa: PLC0415 (aiokafka's reader: 170 ms to import)

    size, _, attributes, _, _, key_length = HEADER.unpack_from(view, pos)
    if kafka_entry_error(view, pos, size, attributes, key_length):
        raise InvalidMessage("not a Kafka batch")
    return batch_timestamps(view[pos + HEADER_SIZE : entry_end], max_decompressed_bytes)
