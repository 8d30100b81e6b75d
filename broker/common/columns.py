"""A fetched message set decoded into columns (docs/protocol.md, "Message format").

`iter_messages` (broker/common/message.py) is the reference decoder: one `Message` per
message. Readers that take whole fetches — the Spark data source, the consumers' batch
reads — need the same messages without a Python object each, and this is the one place
that walks the format for them: `decode_columns` returns a `MessageColumns` whose
per-message fields are `array`s of machine integers and whose keys and values stay in
one `bytes` buffer, addressed by entry position and in message order, so that
`MessageColumns.to_arrow` (`broker/common/columns_arrow.py`, whose `decode_arrow` the
Spark data source reads with) gathers them into an Arrow record batch with numpy in bulk.

The result is exactly what `iter_messages` yields up to its first `CorruptEntry`, and
that entry (`tests/unit/test_columns.py` holds them to it): magic 1 and 2 entries,
compressed wrappers and magic-3 producer batches, compressed or not, are decoded by a
walk that accepts only entries every check passes; an entry it does not accept is
handed to `iter_messages` itself, so every error is the reference's by construction.
A magic-4 entry (a Kafka batch) is read by `kafka_records`, as the reference reads it,
into magic-2 entries in its place, headers in `MessageColumns.headers` (the Arrow
`headers` column).
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass, field

from broker.common.compression import DEFAULT_MAX_DECOMPRESSED, Codec
from broker.common.errors import InvalidMessage
from broker.common.message import (
    BATCH_FIELDS, BATCH_HEADER_SIZE, HEADER, HEADER_SIZE, MAGIC, MAGIC_BATCH, MAGIC_KAFKA, MAGICS, MIN_ENTRY_SIZE,
    SEEDS, V2_SEEDS, CorruptEntry, Message, checksum, entry_crc, inner_set, iter_messages, record_offset,
)

_new = object.__new__
_SET_FIELDS = tuple(getattr(Message, name).__set__ for name in ("offset", "next_offset", "timestamp", "key", "value"))
_SET_HEADERS = Message.headers.__set__  # type: ignore[attr-defined]


def _message(offset: int, next_offset: int, timestamp: int, key: bytes | None, value: bytes) -> Message:
    """`Message(...)` at half the cost: a frozen dataclass's `__init__` goes through
    `object.__setattr__` per field (0.44 us a message); the slots' own setters do the
    same stores (0.25 us)."""
    set_offset, set_next, set_timestamp, set_key, set_value = _SET_FIELDS
    m = _new(Message)
    set_offset(m, offset)
    set_next(m, next_offset)
    set_timestamp(m, timestamp)
    set_key(m, key)
    set_value(m, value)
    _SET_HEADERS(m, ())
    return m


@dataclass(frozen=True, slots=True)
class MessageColumns:
    """The messages of a fetched set, one array element per message.

    `offsets`, `next_offsets` and `timestamps` are as `Message`'s (a wrapper's inner
    message i has the wrapper's offset + i; the last one's `next_offset` is past it). The message's
    entry sits at `data[starts[i]:ends[i]]` — the fetched bytes, each compressed wrapper
    replaced by its decompressed inner set, so entries lie in message order — so its key
    is `data[starts[i] + 22 : starts[i] + 22 + key_lengths[i]]` (None when the length is
    -1) and its value the rest of the entry.

    `next_offset` is where the next fetch starts and what a reader commits after
    taking every message: past the last decoded entry, the fetch's base offset when
    nothing decoded. `corrupt` is the entry the decoding stopped at (`iter_messages`
    would raise it after these messages), None when it stopped at the end or at a
    partial tail. `headers`: by message index, those of the messages with any.
    """

    data: bytes
    offsets: array
    next_offsets: array
    timestamps: array
    starts: array
    ends: array
    key_lengths: array
    next_offset: int
    corrupt: CorruptEntry | None = None
    headers: dict[int, tuple] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.offsets)

    def key(self, i: int) -> bytes | None:
        length = self.key_lengths[i]
        start = self.starts[i] + HEADER_SIZE
        return self.data[start : start + length] if length >= 0 else None

    def value(self, i: int) -> bytes:
        return self.data[self.starts[i] + HEADER_SIZE + max(self.key_lengths[i], 0) : self.ends[i]]

    def keys(self) -> list[bytes | None]:
        data, header = self.data, HEADER_SIZE
        return [data[s + header : s + header + k] if k >= 0 else None for s, k in zip(self.starts, self.key_lengths)]

    def values(self) -> list[bytes]:
        data, header = self.data, HEADER_SIZE
        return [data[s + header + k : e] if k > 0 else data[s + header : e]
                for s, k, e in zip(self.starts, self.key_lengths, self.ends)]

    def messages(self) -> list[Message]:
        """One `Message` per message: the per-message readers' form."""
        messages = list(map(_message, self.offsets, self.next_offsets, self.timestamps, self.keys(), self.values()))
        for i, headers in self.headers.items():
            _SET_HEADERS(messages[i], headers)
        return messages

    def tail(self, first: int) -> "MessageColumns":
        """The messages from index `first` on (a stream that handed some out one by one
        hands the rest out as a batch); `data` is shared, not copied."""
        if first == 0:
            return self
        return MessageColumns(self.data, self.offsets[first:], self.next_offsets[first:], self.timestamps[first:],
                              self.starts[first:], self.ends[first:], self.key_lengths[first:], self.next_offset,
                              self.corrupt, {i - first: h for i, h in self.headers.items() if i >= first})

    def to_arrow(self, topic: str, partition: int):
        """An Arrow record batch of these messages (`broker.common.columns_arrow.COLUMNS`,
        with their Kafka record headers), gathered with numpy, never a Python object per
        message."""
        from broker.common.columns_arrow import record_batch

        return record_batch(self, topic, partition)


def decode_fetched(buf: bytes | bytearray | memoryview, set_offset: int, requested: int,
                   verify_crc: bool = True) -> MessageColumns:
    """A FETCH answer's set — which starts at `set_offset` — from the record at
    `requested` on: a fetch at a record inside an entry is answered with the whole entry
    (docs/protocol.md, FETCH), and the records below the one asked for are dropped."""
    columns = decode_columns(buf, set_offset, verify_crc)
    if set_offset >= requested:
        return columns
    return columns.tail(bisect.bisect_left(columns.offsets, requested))


def empty_columns(offset: int) -> MessageColumns:
    """No messages; the next fetch starts at `offset`."""
    return decode_columns(b"", offset)


def decode_columns(
    buf: bytes | bytearray | memoryview, base_offset: int, verify_crc: bool = True,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
) -> MessageColumns:
    """Decode a fetched set whose first byte is at `base_offset` (arguments as
    `iter_messages`'s). A partial last entry is dropped; decoding stops at the first
    entry `iter_messages` would raise `CorruptEntry` for, which the result carries."""
    data = bytes(buf)  # no copy when it is bytes already
    view = memoryview(data)
    end = len(data)
    cols = _Columns(data)
    pos, corrupt = 0, None
    unpack = HEADER.unpack_from
    while True:
        mark = len(cols.starts)
        pos = cols.plain_run(view, pos, end, verify_crc)
        cols.offsets += [base_offset + s for s in cols.starts[mark:]]  # outer entries: offset = base + position
        cols.moved(mark)
        if end - pos < HEADER_SIZE:
            break
        size, magic, attributes, crc, _, key_length = unpack(view, pos)
        entry_end = pos + 4 + size
        if size >= MIN_ENTRY_SIZE and magic in MAGICS and entry_end > end:
            break  # a partial tail: the next fetch starts at it
        offset = base_offset + pos
        if magic == MAGIC_KAFKA and (not verify_crc or entry_crc(view, pos, entry_end, magic, 0) == crc):
            if opened := cols.open_kafka(view, pos, entry_end, offset, max_decompressed_bytes):
                cols.offsets += [offset + i for i in range(opened)]
                pos = entry_end
                continue
        elif _wrapper_ok(view, pos, entry_end, end, size, magic, attributes, crc, key_length, verify_crc):
            opened = cols.open_wrapper(view, pos, entry_end, magic, attributes, key_length, max_decompressed_bytes)
            if opened:
                cols.offsets += [record_offset(offset, i, entry_end - pos) for i in range(opened)]
                pos = entry_end
                continue
        corrupt = _reference(view, pos, entry_end, end, offset, verify_crc, max_decompressed_bytes)
        break
    view.release()
    offsets = array("q", cols.offsets)
    next_offsets = offsets[1:]
    next_offsets.append(base_offset + pos)
    return MessageColumns(cols.final_data(), offsets, next_offsets, array("q", cols.timestamps),
                          array("q", cols.starts), array("q", cols.ends), array("i", cols.key_lengths),
                          base_offset + pos, corrupt, cols.headers)


def _wrapper_ok(view: memoryview, pos: int, entry_end: int, end: int, size: int, magic: int, attributes: int,
                crc: int, key_length: int, verify_crc: bool) -> bool:
    """Whether the entry at `pos` is a whole wrapper (compressed, or a producer batch)
    that passes `iter_messages`'s checks of the entry itself."""
    return (size >= MIN_ENTRY_SIZE and magic in MAGICS and entry_end <= end
            and (attributes != 0 or magic == MAGIC_BATCH) and 0 <= attributes <= Codec.ZSTD
            and -1 <= key_length <= size - MIN_ENTRY_SIZE
            and (magic != MAGIC_BATCH or size >= MIN_ENTRY_SIZE + BATCH_FIELDS.size)
            and (not verify_crc or checksum(view[pos + 10 : entry_end], SEEDS[magic][attributes]) == crc))


class _Columns:
    """The lists `decode_columns` fills, the walks that fill them, and the data their
    positions address: the fetched bytes, with each compressed wrapper replaced by its
    decompressed inner set, so that entries lie in message order (what a gather in
    bulk, `airflow_provider_logbus.arrow`, relies on)."""

    __slots__ = ("offsets", "timestamps", "starts", "ends", "key_lengths", "headers", "data", "pieces", "copied",
                 "shift")

    def __init__(self, data: bytes) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.key_lengths: list[int] = []
        self.headers: dict[int, tuple] = {}
        self.data = data
        self.pieces: list[bytes] = []  # the final data up to `copied` in the fetched bytes, once it differs
        self.copied = 0
        self.shift = 0  # final position - fetched position, past the last replaced entry

    def replace(self, pos: int, entry_end: int, new: bytes) -> int:
        """Put `new` where the fetched entry [pos, entry_end) was; return where it starts."""
        self.pieces += [self.data[self.copied : pos], new]
        start = pos + self.shift
        self.shift += len(new) - (entry_end - pos)
        self.copied = entry_end
        return start

    def moved(self, mark: int, by: int | None = None) -> None:
        """Move the positions of the messages from index `mark` on by `by` (default:
        what the replacements so far have moved the fetched bytes by)."""
        by = self.shift if by is None else by
        if by:
            self.starts[mark:] = [s + by for s in self.starts[mark:]]
            self.ends[mark:] = [e + by for e in self.ends[mark:]]

    def final_data(self) -> bytes:
        if not self.pieces:
            return self.data
        return b"".join([*self.pieces, self.data[self.copied :]])

    def truncate(self, n: int) -> None:
        """Forget every message from index `n` on (a wrapper the walk gave up on)."""
        for column in (self.offsets, self.timestamps, self.starts, self.ends, self.key_lengths):
            del column[n:]

    def plain_run(self, view: memoryview, pos: int, end: int, verify_crc: bool) -> int:
        """Append every whole, valid, uncompressed magic-1 or -2 entry from `pos` on, and
        return where the first other one starts (or `end`). The inner loop of every
        read, hence the local names; offsets, and moving positions, are the caller's."""
        unpack, crc_of = HEADER.unpack_from, checksum
        add_start, add_end = self.starts.append, self.ends.append
        add_timestamp, add_key_length = self.timestamps.append, self.key_lengths.append
        seed2, min_size, limit = V2_SEEDS[0], MIN_ENTRY_SIZE, end - HEADER_SIZE
        while pos <= limit:
            size, magic, attributes, crc, timestamp, key_length = unpack(view, pos)
            entry_end = pos + 4 + size
            if attributes or entry_end > end or size < min_size or not -1 <= key_length <= size - min_size:
                break
            if magic == 2:
                seed = seed2
            elif magic == 1:
                seed = 0
            else:
                break
            if verify_crc and crc_of(view[pos + 10 : entry_end], seed) != crc:
                break
            add_start(pos)
            add_end(entry_end)
            add_timestamp(timestamp)
            add_key_length(key_length)
            pos = entry_end
        return pos

    def open_wrapper(self, view: memoryview, pos: int, entry_end: int, magic: int, attributes: int, key_length: int,
                     max_decompressed_bytes: int) -> int:
        """Append the inner messages of the wrapper at `pos` and return how many, or 0
        when its inner set is not the valid one `iter_messages` requires (nothing is
        appended then). An uncompressed producer batch is walked where it lies, its
        inner CRCs checked on the way; a compressed set is decompressed, checked by
        `inner_set` and takes the wrapper's place in the data."""
        mark = len(self.starts)
        if magic == MAGIC_BATCH and attributes == 0 and key_length == -1:
            count = BATCH_FIELDS.unpack_from(view, pos + HEADER_SIZE)[3]
            stop = self.plain_run(view, pos + BATCH_HEADER_SIZE, entry_end, True)
            if stop == entry_end and len(self.starts) - mark == count > 0:
                self.moved(mark)
                return count
            self.truncate(mark)
            return 0
        try:
            inner, problem = inner_set(view, pos, entry_end, max_decompressed_bytes)[:2]
        except InvalidMessage:
            return 0
        if problem is not None:
            return 0
        inner = bytes(inner)
        with memoryview(inner) as inner_view:
            stop = self.plain_run(inner_view, 0, len(inner), False)  # `inner_set` checked every inner CRC
        if stop != len(inner):  # cannot happen after `inner_set`'s scan; the reference decides
            self.truncate(mark)
            return 0
        self.moved(mark, self.replace(pos, entry_end, inner))
        return len(self.starts) - mark


    def open_kafka(self, view: memoryview, pos: int, entry_end: int, offset: int, max_decompressed_bytes: int) -> int:
        """Append the records of the magic-4 entry at `pos` (CRC checked) as magic-2 entries
        (CRC 0) in its place; return how many, 0 when `iter_messages` would refuse it."""
        from broker.common.kafka.fetch import kafka_records  # lazy: message.iter_messages says why
        try:
            records = kafka_records(view, pos, entry_end, offset, max_decompressed_bytes)
        except CorruptEntry:
            return 0
        mark, pack, parts = len(self.starts), HEADER.pack, []
        for _, timestamp, key, value, _ in records:
            key_length, value = -1 if key is None else len(key), value or b""
            parts += [pack(MIN_ENTRY_SIZE + max(key_length, 0) + len(value), MAGIC, 0, 0, timestamp, key_length),
                      key or b"", value]
        self.headers.update((mark + i, tuple(r.headers)) for i, r in enumerate(records) if r.headers)
        inner = b"".join(parts)
        self.plain_run(memoryview(inner), 0, len(inner), False)
        self.moved(mark, self.replace(pos, entry_end, inner))
        return len(records)


def _reference(view: memoryview, pos: int, entry_end: int, end: int, offset: int, verify_crc: bool,
               max_decompressed_bytes: int) -> CorruptEntry:
    """The `CorruptEntry` `iter_messages` raises for the entry at `pos`, which the walk
    did not accept: the reference decides what is wrong with it, so the reason is its."""
    whole = MIN_ENTRY_SIZE <= entry_end - pos - 4 and entry_end <= end
    try:  # an entry with a bad size or magic is refused before its end matters
        for _ in iter_messages(view[pos : entry_end if whole else end], offset, verify_crc, max_decompressed_bytes):
            pass
    except CorruptEntry as corrupt:
        return corrupt
    raise AssertionError(f"the columns decoder refused the entry at offset {offset}, which iter_messages decodes")
