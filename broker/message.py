"""The message and message-set format (DESIGN §2, a contract) and its codecs.

An entry on the wire and on disk::

    int32 size | int8 magic | int8 attributes | uint32 crc | int64 timestamp
    | int32 key_length | key | value

The CRC is CRC-32C of every byte after the crc field. The broker never builds Python
objects per message: it validates a set with `scan`, which walks the buffer with
`struct.unpack_from` and checks CRCs over memoryview slices. Clients decode with
`iter_messages`, which yields one `Message` per (possibly decompressed) message.
"""

from __future__ import annotations

import enum
import gzip
import struct
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import crcmod.predefined

from broker.errors import InvalidMessage, MessageTooLarge

MAGIC = 1
HEADER = struct.Struct(">ibbIqi")
HEADER_SIZE = HEADER.size  # 22: the per-message overhead
SIZE_FIELD = 4
CRC_END = 10  # bytes before the first CRC-covered byte
MIN_ENTRY_SIZE = HEADER_SIZE - SIZE_FIELD  # value of `size` for an empty key and value
CODEC_MASK = 0x07
_SIZE = struct.Struct(">i")
_CRC = struct.Struct(">I")

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


class Codec(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def parse(cls, name: "str | int | Codec | None") -> "Codec":
        """Accepts 'gzip', 1, Codec.GZIP or None, so configuration can use names."""
        if name is None:
            return cls.NONE
        if isinstance(name, str):
            try:
                return cls[name.strip().upper()]
            except KeyError:
                raise ValueError(
                    f"unknown compression codec {name!r}; choose one of "
                    + ", ".join(c.name.lower() for c in cls)
                ) from None
        return cls(name)


def _optional_codec(codec: Codec) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    """(compress, decompress) for the codecs whose libraries are optional extras."""
    try:
        if codec is Codec.SNAPPY:
            import snappy  # type: ignore[import-not-found]

            return snappy.compress, snappy.decompress
        if codec is Codec.LZ4:
            import lz4.frame  # type: ignore[import-not-found]

            return lz4.frame.compress, lz4.frame.decompress
        if codec is Codec.ZSTD:
            import zstandard  # type: ignore[import-not-found]

            return zstandard.ZstdCompressor().compress, zstandard.ZstdDecompressor().decompress
    except ImportError as exc:
        package = {Codec.SNAPPY: "python-snappy", Codec.LZ4: "lz4", Codec.ZSTD: "zstandard"}[codec]
        raise InvalidMessage(
            f"compression codec {codec.name.lower()} needs the {package!r} package "
            f"(pip install 'logbus[{codec.name.lower()}]')"
        ) from exc
    raise InvalidMessage(f"unknown compression codec {int(codec)}")


def compress(codec: Codec, data: bytes) -> bytes:
    if codec is Codec.NONE:
        return data
    if codec is Codec.GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    return _optional_codec(codec)[0](data)


def decompress(codec: Codec, data: bytes) -> bytes:
    if codec is Codec.NONE:
        return data
    try:
        if codec is Codec.GZIP:
            return gzip.decompress(data)
        return _optional_codec(codec)[1](data)
    except InvalidMessage:
        raise
    except Exception as exc:  # every codec library has its own error classes
        raise InvalidMessage(f"cannot decompress a {codec.name.lower()} entry: {exc}") from exc


def now_ms() -> int:
    return int(time.time() * 1000)


_ENTRY_HEAD = struct.Struct(">ibbI")  # size, magic, attributes, crc
_ENTRY_TAIL = struct.Struct(">qi")  # timestamp, key_length: the first CRC-covered bytes


def append_entry(
    out: bytearray,
    value: bytes,
    key: bytes | None = None,
    timestamp: int | None = None,
    attributes: int = 0,
) -> None:
    """Encode one entry at the end of `out` (the producer's inner loop: the covered
    bytes are built once and checksummed once)."""
    covered = _ENTRY_TAIL.pack(now_ms() if timestamp is None else timestamp, -1 if key is None else len(key))
    if key:
        covered += key
    covered += value
    out += _ENTRY_HEAD.pack(len(covered) + 6, MAGIC, attributes, checksum(covered))
    out += covered


def encode_message_set(
    messages: Iterable[tuple[bytes | None, bytes, int | None]],
    codec: Codec | str | None = Codec.NONE,
) -> bytes:
    """Encode (key, value, timestamp) tuples as one message set.

    With a codec, the whole set becomes the value of a single wrapper entry whose
    timestamp is the largest inner timestamp (DESIGN §2).
    """
    codec = Codec.parse(codec)
    out = bytearray()
    largest = -1
    now = None
    for key, value, timestamp in messages:
        if timestamp is None:
            timestamp = now = now or now_ms()
        if timestamp > largest:
            largest = timestamp
        append_entry(out, value, key, timestamp)
    if codec is Codec.NONE or not out:
        return bytes(out)
    wrapper = bytearray()
    append_entry(wrapper, compress(codec, bytes(out)), None, largest, int(codec))
    return bytes(wrapper)


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What `scan` learnt of a buffer: the valid prefix and what it holds."""

    valid_bytes: int
    count: int
    min_timestamp: int
    max_timestamp: int
    error: str | None  # why the scan stopped before the end, None at a clean end
    too_large: bool = False  # it stopped at a valid entry over `max_message_bytes`

    @property
    def partial_tail(self) -> bool:
        return self.error is not None and self.error.startswith("partial")


def scan(buf: bytes | bytearray | memoryview, max_entry_bytes: int = 1 << 31, max_message_bytes: int = 0) -> ScanResult:
    """Walk entries from the start; stop at the first one that is partial or invalid,
    or (with `max_message_bytes`) valid but larger than that, size field included.

    This is the one validator: the broker accepts a produced set only when the scan
    covers all of it, and recovery truncates a segment at `valid_bytes`. It is the
    produce path's inner loop, hence the local names and plain-int constants.
    """
    view = memoryview(buf)
    end = len(view)
    pos = count = 0
    min_ts, max_ts = 1 << 62, -1
    unpack, crc_of = HEADER.unpack_from, checksum
    header_size, min_size, max_codec = HEADER_SIZE, MIN_ENTRY_SIZE, int(Codec.ZSTD)
    error, too_large = None, False
    try:
        while pos < end:
            if end - pos < header_size:
                error = f"partial entry header at byte {pos}"
                break
            size, magic, attributes, crc, timestamp, key_length = unpack(view, pos)
            entry_end = pos + 4 + size
            if size < min_size or size > max_entry_bytes:
                error = f"impossible entry size {size} at byte {pos}"
                break
            if entry_end > end:
                error = f"partial entry at byte {pos}: needs {size + 4} bytes, {end - pos} left"
                break
            if magic != 1 or not 0 <= attributes <= max_codec or not -1 <= key_length <= size - min_size:
                error = _header_error(pos, magic, attributes, key_length)
                break
            if crc_of(view[pos + 10 : entry_end]) != crc:
                error = f"CRC mismatch at byte {pos}"
                break
            if max_message_bytes and size + 4 > max_message_bytes:
                error = f"message of {size + 4} bytes at byte {pos} exceeds message.max.bytes={max_message_bytes}"
                too_large = True
                break
            count += 1
            if timestamp < min_ts:
                min_ts = timestamp
            if timestamp > max_ts:
                max_ts = timestamp
            pos = entry_end
    finally:
        view.release()
    return ScanResult(pos, count, min_ts if count else -1, max_ts, error, too_large)


def _header_error(pos: int, magic: int, attributes: int, key_length: int) -> str:
    if magic != MAGIC:
        return f"unknown magic {magic} at byte {pos}"
    if not 0 <= attributes <= Codec.ZSTD:
        return f"unknown attributes {attributes:#x} at byte {pos}"
    return f"impossible key length {key_length} at byte {pos}"


def validate_message_set(buf: bytes | memoryview, max_message_bytes: int) -> ScanResult:
    """The broker's check of a produced set: every byte must be valid entries, none
    over `max_message_bytes` — one walk."""
    if len(buf) == 0:
        raise InvalidMessage("empty message set")
    result = scan(buf, max_entry_bytes=1 << 31, max_message_bytes=max_message_bytes)
    if result.too_large:
        raise MessageTooLarge(result.error)
    if result.error is not None:
        raise InvalidMessage(f"invalid message set: {result.error}")
    return result


@dataclass(frozen=True, slots=True)
class Message:
    """A message as a consumer sees it.

    `offset` addresses the entry that holds it; `next_offset` is where to resume once
    this message is processed. For messages inside a compressed wrapper both point at
    the wrapper, except that the last inner message's `next_offset` is past the
    wrapper — so committing `next_offset` never skips half a wrapper.
    """

    offset: int
    next_offset: int
    timestamp: int
    key: bytes | None
    value: bytes


def first_entry_size(buf: bytes | memoryview) -> int | None:
    """Bytes the first entry of `buf` needs (size field included), or None if unknown."""
    if len(buf) < SIZE_FIELD:
        return None
    return _SIZE.unpack_from(buf, 0)[0] + SIZE_FIELD


def iter_messages(
    buf: bytes | memoryview, base_offset: int, verify_crc: bool = True
) -> Iterator[Message]:
    """Decode a fetched set. A partial last entry is silently dropped (DESIGN §3)."""
    view = memoryview(buf)
    pos, end = 0, len(view)
    while end - pos >= HEADER_SIZE:
        size, magic, attributes, crc, timestamp, key_length = HEADER.unpack_from(view, pos)
        entry_end = pos + SIZE_FIELD + size
        if size < MIN_ENTRY_SIZE or magic != MAGIC:
            raise InvalidMessage(f"corrupt entry at offset {base_offset + pos} (size {size}, magic {magic})")
        if entry_end > end:
            return
        if verify_crc and checksum(view[pos + CRC_END : entry_end]) != crc:
            raise InvalidMessage(f"CRC mismatch in entry at offset {base_offset + pos}")
        body = pos + HEADER_SIZE
        if key_length >= 0:
            key: bytes | None = bytes(view[body : body + key_length])
            body += key_length
        else:
            key = None
        value = bytes(view[body:entry_end])
        offset, next_offset = base_offset + pos, base_offset + entry_end
        codec = Codec(attributes & CODEC_MASK)
        if codec is Codec.NONE:
            yield Message(offset, next_offset, timestamp, key, value)
        else:
            inner = list(iter_messages(decompress(codec, value), 0, verify_crc))
            for i, message in enumerate(inner):
                resume = next_offset if i == len(inner) - 1 else offset
                yield Message(offset, resume, message.timestamp, message.key, message.value)
        pos = entry_end
