"""The message and message-set format (docs/protocol.md, "Message format", a contract)
and its codecs.

An entry on the wire and on disk::

    int32 size | int8 magic | int8 attributes | uint32 crc | int64 timestamp
    | int32 key_length | key | value

Magic 2 has a CRC-32C over magic, attributes and every byte after the crc field, so a
flipped codec bit is caught like any other corruption; magic 1 (still read) covered
only the bytes after the crc field. Magic 3 is an idempotent producer's *batch*: a
wrapper (key_length -1) whose value starts with the batch's identity, then its inner
set of magic-2 entries (compressed with the attributes' codec, or not)::

    int64 producer_id | int16 producer_epoch | int32 base_sequence | int32 count | inner set

The CRC covers these fields like every other byte after the crc field, and `count`
must be the inner set's number of messages, so a broker can dedupe by sequence. Magic 4
holds one Kafka RecordBatch v2 as its value (attributes 0, key_length -1, CRC as magic
2's; docs/kafka.md, "Record batches"): only the broker writes it, its records' offsets
are its position plus offsetDelta, and its identity is the batch header's
(producerId, producerEpoch, baseSequence, recordsCount at `KAFKA_FIELDS_AT`). The broker never
builds Python objects per message: it validates a set with `scan`, which walks the
buffer with `struct.unpack_from` and checks CRCs over memoryview slices, and looks
inside compressed entries (`validate_message_set`) so that nothing it acknowledges is
undecodable. The writers (`append_entry`, `encode_message_set`, `encode_batch`) are
`broker.common.encoding`'s, re-exported here. Clients decode with `iter_messages`, which yields one `Message` per
(possibly decompressed) message and raises `CorruptEntry` — naming the entry's offset
and size, so a reader can step past it — at the first entry it cannot decode.
"""

from __future__ import annotations

import enum
import functools
import struct
from dataclasses import dataclass
from typing import Iterator, NamedTuple

from broker.common.compression import DEFAULT_MAX_DECOMPRESSED, Codec, decompress
from broker.common.entry import (  # the entry header's names, imported from here by every reader and writer
    BATCH_FIELDS, BATCH_HEADER_SIZE, CODEC_MASK, CRC_END, FIELDS_AT, HEADER, HEADER_SIZE, KAFKA_FIELDS_AT,
    KAFKA_HEADER_SIZE, MAGIC, MAGIC_BATCH, MAGIC_KAFKA, MAGIC_V1, MAGICS, MIN_ENTRY_SIZE, SEEDS, SEQUENCE_LIMIT,
    SIZE_FIELD, V2_SEEDS, V3_SEEDS, V4_SEEDS, BatchIdentity, batch_identity, checksum, crc32c, entry_crc,
    header_error, iter_batches, kafka_entry_error, now_ms,
)
from broker.common.encoding import append_entry, encode_batch, encode_message_set  # the writers, re-exported
from broker.common.errors import InvalidMessage, MessageTooLarge

_SIZE = struct.Struct(">i")


class ScanStop(enum.Enum):
    """Where `scan` stopped. Callers branch on this, never on the text of the error:
    a partial tail is where a fetch or a chunk of a file ends (read on), an invalid
    entry is corruption (refuse it, or truncate there)."""

    END = "end"  # at the end of the buffer: every byte belongs to a valid entry
    PARTIAL = "partial"  # at an entry, or its header, that runs past the end of the buffer
    INVALID = "invalid"  # at an entry with an impossible size, magic, attributes or key length, or a bad CRC
    TOO_LARGE = "too large"  # at a valid entry over `max_message_bytes`


class ScanResult(NamedTuple):
    """What `scan` learnt of a buffer: the valid prefix, what it holds, and why the
    walk stopped (`stop`; `error` says it to a person, None at a clean end). A tuple
    made in C (`tuple.__new__`): one per produced set, on the produce path."""

    valid_bytes: int
    count: int
    min_timestamp: int
    max_timestamp: int
    stop: ScanStop
    error: str | None = None
    compressed: int = 0  # entries in the valid prefix whose value is a compressed set
    batches: int = 0  # magic-3 and -4 entries (producer and Kafka batches) in the valid prefix
    records: int = -1  # messages (records) in the valid prefix; -1 where `scan` alone cannot tell (see `count_records`)
    record_times: tuple[int, int] | None = None  # min, max of the records' timestamps; None where `records` is -1

    @property
    def partial_tail(self) -> bool:
        return self.stop is ScanStop.PARTIAL

    @property
    def too_large(self) -> bool:
        return self.stop is ScanStop.TOO_LARGE


_new_scan_result = functools.partial(tuple.__new__, ScanResult)
# plain loads in `scan`, not an enum's attribute or a sum per call
_MAX_CODEC, _BATCH_MIN_SIZE, _END = int(Codec.ZSTD), MIN_ENTRY_SIZE + BATCH_FIELDS.size, ScanStop.END


def scan(buf: bytes | bytearray | memoryview, max_entry_bytes: int = 1 << 31, max_message_bytes: int = 0,
         max_magic: int = MAGIC_KAFKA) -> ScanResult:
    """Walk entries from the start; stop at the first one that is partial or invalid,
    or (with `max_message_bytes`) valid but larger than that, size field included.
    A magic above `max_magic` is invalid (a native produce's: only the broker writes
    magic 4); a magic-4 entry's batch must fill it (batchLength) and be magic 2.

    This is the one validator: the broker accepts a produced set only when the scan
    covers all of it, and recovery truncates a segment at `valid_bytes`. It is the
    produce path's inner loop, hence the local names and plain-int constants.
    """
    view = memoryview(buf)
    end = len(view)
    pos = count = 0
    min_ts, max_ts = 1 << 62, -1
    unpack, crc_of = HEADER.unpack_from, checksum
    header_size, min_size, max_codec, batch_min_size = HEADER_SIZE, MIN_ENTRY_SIZE, _MAX_CODEC, _BATCH_MIN_SIZE
    error, stop = None, _END
    compressed = batches = 0
    v2, v3, seeds, seeds3, top = MAGIC, MAGIC_BATCH, V2_SEEDS, V3_SEEDS, max_magic  # attributes: checked 0..4 first
    try:
        while pos < end:
            if end - pos < header_size:
                error, stop = f"partial entry header at byte {pos}", ScanStop.PARTIAL
                break
            size, magic, attributes, crc, timestamp, key_length = unpack(view, pos)
            entry_end = pos + 4 + size
            if size < min_size or size > max_entry_bytes:
                error, stop = f"impossible entry size {size} at byte {pos}", ScanStop.INVALID
                break
            if entry_end > end:
                error, stop = f"partial entry at byte {pos}: needs {size + 4} bytes, {end - pos} left", ScanStop.PARTIAL
                break
            if not 1 <= magic <= top or not 0 <= attributes <= max_codec or not -1 <= key_length <= size - min_size:
                error, stop = header_error(pos, magic, attributes, key_length, max_magic), ScanStop.INVALID
                break
            if magic == v2:
                seed = seeds[attributes]
            elif magic == v3:
                if key_length != -1 or size < batch_min_size:
                    error, stop = f"a producer batch at byte {pos} has a key or no room for its fields", ScanStop.INVALID
                    break
                batches += 1
                seed = seeds3[attributes]
            elif magic == 4:  # MAGIC_KAFKA: checked field by field, then CRC'd like magic 2
                error = kafka_entry_error(view, pos, size, attributes, key_length)
                if error:
                    stop = ScanStop.INVALID
                    break
                batches += 1
                seed = V4_SEEDS[0]
            else:
                seed = 0
            if crc_of(view[pos + 10 : entry_end], seed) != crc:
                error, stop = f"CRC mismatch at byte {pos}", ScanStop.INVALID
                break
            if max_message_bytes and size + 4 > max_message_bytes:
                error = f"message of {size + 4} bytes at byte {pos} exceeds message.max.bytes={max_message_bytes}"
                stop = ScanStop.TOO_LARGE
                break
            count += 1
            if attributes:
                compressed += 1
            if timestamp < min_ts:
                min_ts = timestamp
            if timestamp > max_ts:
                max_ts = timestamp
            pos = entry_end
    finally:
        view.release()
    records = count if not (compressed or batches) else -1
    return _new_scan_result((pos, count, min_ts if count else -1, max_ts, stop, error, compressed, batches, records,
                             (min_ts, max_ts) if count and records >= 0 else None))


def validate_message_set(
    buf: bytes | memoryview, max_message_bytes: int, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
) -> ScanResult:
    """The broker's check of a produced set: every byte must be valid entries, none
    over `max_message_bytes` — one walk — and every compressed entry must decompress
    (to at most `max_decompressed_bytes`) into a valid set of uncompressed entries.
    Uncompressed sets, the common case, cost nothing more than the walk."""
    if len(buf) == 0:
        raise InvalidMessage("empty message set")
    result = scan(buf, 1 << 31, max_message_bytes, MAGIC_BATCH)
    if result.stop is not _END:  # once a request: a constant (~15 ns), not the member (~170 ns in CPython 3.11)
        if result.stop is ScanStop.TOO_LARGE:
            raise MessageTooLarge(result.error)
        raise InvalidMessage(f"invalid message set: {result.error}")
    if result.compressed or result.batches:
        records, times = _validate_wrappers(buf, max_decompressed_bytes)
        return result._replace(records=records, record_times=times)
    return result


def _validate_wrappers(buf: bytes | memoryview, max_decompressed_bytes: int) -> tuple[int, tuple[int, int]]:
    """Open every wrapper (compressed entry or producer batch) of a scanned set, check
    its inner set and that it spans an offset per message; returns the set's records
    and the min and max of their own timestamps (a wrapper's header has one of its own)."""
    records, low, high = 0, 1 << 62, -(1 << 62)
    with memoryview(buf) as view:
        pos, end = 0, len(view)
        while pos < end:
            size, magic, attributes, _, timestamp, key_length = HEADER.unpack_from(view, pos)
            entry_end = pos + SIZE_FIELD + size
            if attributes or magic == MAGIC_BATCH:
                _, problem, count, first, last = inner_set(view, pos, entry_end, max_decompressed_bytes)
                what = "producer batch" if magic == MAGIC_BATCH else f"{Codec(attributes).name.lower()} entry"
                if problem:
                    raise InvalidMessage(f"invalid message set: {what} at byte {pos}: {problem}")
                low, high = min(low, first), max(high, last)
                if count > entry_end - pos:
                    raise InvalidMessage(
                        f"invalid message set: {what} at byte {pos} holds {count} messages in {entry_end - pos} bytes; "
                        f"a message's offset is its entry's position plus its index, so an entry must span at least "
                        f"as many bytes as it holds messages: compress fewer messages together, or send them uncompressed"
                    )
                records += count
            else:
                records, low, high = records + 1, min(low, timestamp), max(high, timestamp)
            pos = entry_end
    return records, (low, high)


def record_offset(entry_offset: int, index: int, entry_span: int) -> int:
    """The offset of message `index` of the entry at `entry_offset`: its position plus
    the index (docs/architecture.md, "Offsets"). Writers keep `index < entry_span`; an
    entry written before that rule could break it, and its surplus messages share the
    entry's last offset rather than run into the next entry's."""
    return entry_offset + min(index, entry_span - 1)


class InnerSet(NamedTuple):
    """A wrapper's inner set, why it is invalid (None: valid), and from the same walk its
    messages and their smallest and largest timestamps."""
    messages: bytes | memoryview
    problem: str | None
    count: int
    min_timestamp: int
    max_timestamp: int


def inner_set(view: memoryview, pos: int, entry_end: int,
              max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED) -> InnerSet:
    """The inner set of the wrapper entry at `pos`. Raises InvalidMessage when it
    cannot be decompressed."""
    _, magic, attributes, _, _, key_length = HEADER.unpack_from(view, pos)
    codec = Codec(attributes & CODEC_MASK)
    start = pos + HEADER_SIZE + max(key_length, 0)
    count = -1
    if magic == MAGIC_BATCH:
        count = BATCH_FIELDS.unpack_from(view, start)[3]
        start += BATCH_FIELDS.size
    inner = decompress(codec, view[start:entry_end], max_decompressed_bytes) if codec else view[start:entry_end]
    return InnerSet(inner, *_check_inner_set(inner, count))


def _check_inner_set(inner: bytes | memoryview, count: int = -1) -> tuple[str | None, int, int, int]:
    """Why a wrapper's inner set is invalid, its messages and their timestamps' bounds:
    whole, valid, unwrapped entries (a reader decompresses once), in a producer batch
    exactly `count`."""
    if not len(inner):
        return "it holds an empty message set", 0, -1, -1
    result = scan(inner)
    problem = None
    if result.stop is not ScanStop.END:
        problem = f"its inner set is invalid: {result.error}"
    elif result.compressed or result.batches:
        problem = "its inner set holds a wrapper (nesting is not allowed)"
    elif count >= 0 and result.count != count:
        problem = f"its count field says {count} messages, its inner set holds {result.count}"
    return problem, result.count, result.min_timestamp, result.max_timestamp


@dataclass(frozen=True, slots=True)
class Message:
    """A message as a consumer sees it.

    `offset` is the message's own: the position of the entry that holds it plus its
    index in the entry (0 for a plain entry; docs/architecture.md, "Offsets"), unique
    and increasing in a partition. `next_offset` is where to resume once this message
    is processed: the next message's offset inside a wrapper, past the entry after its
    last message — so a fetch resumes in the middle of a batch or at the next entry.
    `headers`: a Kafka record's (key, value) pairs, empty for a native message; a
    Kafka record's null value reads as b"" (docs/kafka.md, "Native readers").
    """

    offset: int
    next_offset: int
    timestamp: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...] = ()


def first_entry_size(buf: bytes | memoryview) -> int | None:
    """Bytes the first entry of `buf` needs (size field included), or None if unknown."""
    if len(buf) < SIZE_FIELD:
        return None
    return _SIZE.unpack_from(buf, 0)[0] + SIZE_FIELD


def whole_entries(buf: bytes | memoryview) -> int:
    """Bytes at the start of `buf` made of whole entries, by their size fields alone:
    where a reader that passes sets on undecoded (the provider's range read) may cut.
    Stops at a partial entry and at an impossible size; CRCs are the decoder's job."""
    pos, end = 0, len(buf)
    unpack, min_size = _SIZE.unpack_from, MIN_ENTRY_SIZE
    while end - pos >= HEADER_SIZE:
        (size,) = unpack(buf, pos)
        if size < min_size or pos + SIZE_FIELD + size > end:
            break
        pos += SIZE_FIELD + size
    return pos


class CorruptEntry(InvalidMessage):
    """An entry a reader cannot decode: bad size, magic, attributes, CRC, or a
    compressed value that does not hold a valid set. `offset` is the entry's;
    `next_offset` is `offset + 4 + size` when the size field is plausible (the way
    past it), else None."""

    def __init__(self, offset: int, size: int, reason: str) -> None:
        super().__init__(f"corrupt entry at offset {offset}: {reason}")
        self.offset = offset
        self.size = size
        self.reason = reason

    @property
    def next_offset(self) -> int | None:
        return self.offset + SIZE_FIELD + self.size if self.size >= MIN_ENTRY_SIZE else None


def iter_messages(
    buf: bytes | memoryview, base_offset: int, verify_crc: bool = True,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
) -> Iterator[Message]:
    """Decode a fetched set. A partial last entry is silently dropped (docs/protocol.md, FETCH).
    Raises `CorruptEntry` at the first entry that cannot be decoded, after yielding
    every message before it; the messages of a compressed entry are yielded only once
    the whole entry decoded."""
    view = memoryview(buf)
    pos, end = 0, len(view)
    while end - pos >= HEADER_SIZE:
        size, magic, attributes, crc, timestamp, key_length = HEADER.unpack_from(view, pos)
        entry_end = pos + SIZE_FIELD + size
        offset = base_offset + pos
        if size < MIN_ENTRY_SIZE:
            raise CorruptEntry(offset, size, f"impossible size {size}")
        if magic not in MAGICS:
            raise CorruptEntry(offset, size, f"unknown magic {magic}")
        if entry_end > end:
            return
        if verify_crc and entry_crc(view, pos, entry_end, magic, attributes) != crc:
            raise CorruptEntry(offset, size, "CRC mismatch")
        if attributes & ~CODEC_MASK or attributes > _MAX_CODEC or not -1 <= key_length <= size - MIN_ENTRY_SIZE:
            raise CorruptEntry(offset, size, f"impossible attributes {attributes:#x} or key length {key_length}")
        next_offset = base_offset + entry_end
        if magic == MAGIC_KAFKA:
            # imported here: aiokafka's C reader costs 170 ms to import, paid only by a
            # reader of Kafka-written data; and kafka.fetch imports this module
            from broker.common.kafka.fetch import kafka_messages

            yield from kafka_messages(view, pos, entry_end, offset, max_decompressed_bytes)
        elif attributes == 0 and magic != MAGIC_BATCH:
            body = pos + HEADER_SIZE
            if key_length >= 0:
                key: bytes | None = bytes(view[body : body + key_length])
                body += key_length
            else:
                key = None
            yield Message(offset, next_offset, timestamp, key, bytes(view[body:entry_end]))
        else:
            what = "producer batch" if magic == MAGIC_BATCH else f"{Codec(attributes).name.lower()} value"
            try:
                if magic == MAGIC_BATCH and size < MIN_ENTRY_SIZE + BATCH_FIELDS.size:
                    raise InvalidMessage("no room for its fields")
                inner_bytes, problem = inner_set(view, pos, entry_end, max_decompressed_bytes)[:2]
                if problem is not None:
                    raise InvalidMessage(problem)
                inner = list(iter_messages(inner_bytes, 0, verify_crc=False))  # `_check_inner_set` checked every CRC
            except InvalidMessage as exc:
                raise CorruptEntry(offset, size, f"{what}: {exc}") from None
            last = len(inner) - 1
            span = SIZE_FIELD + size
            for i, message in enumerate(inner):
                own = record_offset(offset, i, span)
                resume = next_offset if i == last else record_offset(offset, i + 1, span)
                yield Message(own, resume, message.timestamp, message.key, message.value)
        pos = entry_end


def decode_messages(
    buf: bytes | memoryview, base_offset: int, verify_crc: bool = True,
) -> tuple[list[Message], CorruptEntry | None]:
    """The messages of a fetched set up to its first undecodable entry, and that entry
    (None if there is none): a reader delivers what is good before deciding what to
    do about the bad one."""
    messages: list[Message] = []
    try:
        for message in iter_messages(buf, base_offset, verify_crc):
            messages.append(message)
    except CorruptEntry as corrupt:
        return messages, corrupt
    return messages, None
