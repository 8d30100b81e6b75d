"""Writing entries (docs/protocol.md, "Message format"): one entry, a message set, an
idempotent producer's batch. The producer's hot path: `broker.common.message` holds
the layout and re-exports these, the scanner and the decoders.

A set is encoded in one pass over its messages and joined once; a wrapper (a
compressed set, a producer batch) continues its CRC over its value's pieces and is
joined once more. `map` over C functions instead of the loop was measured slower in
CPython 3.11: the C calls (a CRC, a `pack`) are the cost, not the bytecode around them.
"""

from __future__ import annotations

import struct
from typing import Iterable

from broker.common.compression import Codec, compress
from broker.common.entry import BATCH_FIELDS, HEADER, MAGIC, MAGIC_BATCH, SEEDS, V2_SEEDS, BatchIdentity, checksum, now_ms

_ENTRY_HEAD = struct.Struct(">ibbI")  # size, magic, attributes, crc
_ENTRY_TAIL = struct.Struct(">qi")  # timestamp, key_length: the first bytes after the crc
_COVERED = 18  # an entry's size field counts these bytes besides key and value: magic to key_length
# Enum members as constants on a hot path (docs/architecture.md, "Enum members on hot paths").
_PLAIN = Codec.NONE

Messages = Iterable[tuple[bytes | None, bytes, int | None]]


def append_entry(out: bytearray, value: bytes, key: bytes | None = None, timestamp: int | None = None,
                 attributes: int = 0, magic: int = MAGIC) -> None:
    """Encode one entry at the end of `out` (covered bytes built and checksummed once)."""
    covered = _ENTRY_TAIL.pack(now_ms() if timestamp is None else timestamp, -1 if key is None else len(key))
    if key:
        covered += key
    covered += value
    out += _ENTRY_HEAD.pack(len(covered) + 6, magic, attributes, checksum(covered, SEEDS[magic][attributes & 0xFF]))
    out += covered


def _wrapper(value_parts: tuple[bytes, ...], timestamp: int, attributes: int, magic: int) -> bytes:
    """One keyless entry whose value is `value_parts` joined: the CRC continued over
    the parts, one join for the whole entry (`append_entry` copies its value twice)."""
    tail = _ENTRY_TAIL.pack(timestamp, -1)
    crc = checksum(tail, SEEDS[magic][attributes])
    size = len(tail) + 6
    for part in value_parts:
        crc = checksum(part, crc)
        size += len(part)
    return b"".join((_ENTRY_HEAD.pack(size, magic, attributes, crc), tail, *value_parts))


def encode_message_set(messages: Messages, codec: Codec | str | None = _PLAIN) -> bytes:
    """(key, value, timestamp) tuples as one set; with a codec, one wrapper entry of the
    largest inner timestamp (docs/protocol.md), unless it would span fewer bytes than it
    holds messages, which the broker refuses (docs/architecture.md, "Offsets")."""
    if codec is _PLAIN and (type(messages) is tuple or type(messages) is list) and len(messages) == 1:
        return _one_entry(*messages[0])  # a sealed one-message batch holds a tuple (ProducerBatch.seal)
    codec = Codec.parse(codec)
    parts, largest, count = _inner_parts(messages)
    inner = b"".join(parts)
    if codec is _PLAIN or not inner:
        return inner
    wrapper = _wrapper((compress(codec, inner),), largest, int(codec), MAGIC)
    return inner if len(wrapper) < count else wrapper


def encode_batch(messages: Messages, identity: BatchIdentity, codec: Codec | str | None = _PLAIN) -> bytes:
    """An idempotent producer's batch: one magic-3 entry of `messages` (their count in
    `identity`), uncompressed when compressed it would break encode_message_set's rule."""
    codec = Codec.parse(codec)
    parts, largest, count = _inner_parts(messages)
    if identity.count != count or not count:
        raise ValueError(f"a batch of {count} messages cannot carry count {identity.count}")
    fields, inner = BATCH_FIELDS.pack(*identity), b"".join(parts)
    if codec is not _PLAIN:
        out = _wrapper((fields, compress(codec, inner)), largest, int(codec), MAGIC_BATCH)
        if len(out) >= count:
            return out
    return _wrapper((fields, inner), largest, 0, MAGIC_BATCH)


def _one_entry(key: bytes | None, value: bytes, timestamp: int | None) -> bytes:
    """A set of one plain message, `_inner_parts`'s bytes without its list and join: at
    batch 1 every batch the sender encodes."""
    if timestamp is None:
        timestamp = now_ms()
    length = -1 if key is None else len(key)
    crc = checksum(_ENTRY_TAIL.pack(timestamp, length), V2_SEEDS[0])
    if key is None:
        return HEADER.pack(len(value) + _COVERED, MAGIC, 0, checksum(value, crc), timestamp, -1) + value
    return HEADER.pack(length + len(value) + _COVERED, MAGIC, 0, checksum(value, checksum(key, crc)), timestamp,
                       length) + key + value


def _inner_parts(messages: Messages) -> tuple[list[bytes], int, int]:
    """Magic-2 entries as pieces for one join, their largest timestamp and count. Per
    message one header `pack` and one CRC over the value (and key), continued from the
    CRC of the header's tail, which a batch's messages share while their timestamp and
    key length do: computed again only when these change."""
    parts: list[bytes] = []
    add = parts.append
    largest, now, seed, keyed = -1, None, V2_SEEDS[0], 0
    crc, tail, header = checksum, _ENTRY_TAIL.pack, HEADER.pack
    last_time = last_length = tail_crc = None
    for key, value, timestamp in messages:
        if timestamp is None:
            timestamp = now = now or now_ms()
        if key is None:
            if timestamp != last_time or last_length != -1:
                last_time, last_length, tail_crc = timestamp, -1, crc(tail(timestamp, -1), seed)
                largest = timestamp if timestamp > largest else largest
            add(header(len(value) + _COVERED, MAGIC, 0, crc(value, tail_crc), timestamp, -1))
        else:
            length = len(key)
            if timestamp != last_time or length != last_length:
                last_time, last_length, tail_crc = timestamp, length, crc(tail(timestamp, length), seed)
                largest = timestamp if timestamp > largest else largest
            add(header(length + len(value) + _COVERED, MAGIC, 0, crc(value, crc(key, tail_crc)), timestamp, length))
            add(key)
            keyed += 1
        add(value)
    return parts, largest, (len(parts) - keyed) // 2  # two pieces a message, three with a key
