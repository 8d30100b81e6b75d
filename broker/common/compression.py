"""Compression codecs of the message format (docs/protocol.md, "Message format", a
contract): gzip built in, snappy, lz4 and zstd from optional extras, and decompression
with a bound on the output, so a bomb of a few KiB cannot make the broker allocate
gigabytes: gzip, lz4 and zstd stop at the bound, snappy is refused by the lengths its
blocks declare. snappy is read raw or in xerial's framing (Kafka's Java producer's).
`broker.common.message` wraps compressed sets with these."""

from __future__ import annotations

import enum
import gzip
import struct
import zlib
from typing import Callable

from broker.common.errors import InvalidMessage


class Codec(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def parse(cls, name: "str | int | Codec | None") -> "Codec":
        """Accepts 'gzip', 1, Codec.GZIP or None, so configuration can use names."""
        if type(name) is cls:  # the encoders' per-batch call
            return name
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


_PACKAGES = {Codec.SNAPPY: "cramjam", Codec.LZ4: "lz4", Codec.ZSTD: "zstandard"}  # the extras' packages


def _missing(codec: Codec) -> InvalidMessage:
    """The refusal of a codec whose package is not installed, naming the extra."""
    return InvalidMessage(f"compression codec {codec.name.lower()} needs the {_PACKAGES[codec]!r} package "
                          f"(pip install 'logbus[{codec.name.lower()}]')")


def _compressor(codec: Codec) -> Callable[[bytes], bytes]:
    """The compressor of a codec whose library is an optional extra."""
    try:
        if codec is Codec.SNAPPY:
            import cramjam  # type: ignore[import-not-found]

            return lambda data: bytes(cramjam.snappy.compress_raw(data))  # raw, as librdkafka writes it
        if codec is Codec.LZ4:
            import lz4.frame  # type: ignore[import-not-found]

            return lz4.frame.compress
        if codec is Codec.ZSTD:
            import zstandard  # type: ignore[import-not-found]

            return zstandard.ZstdCompressor().compress
    except ImportError as exc:
        raise _missing(codec) from exc
    raise InvalidMessage(f"unknown compression codec {int(codec)}")


def compress(codec: Codec, data: bytes) -> bytes:
    if codec is Codec.NONE:
        return data
    if codec is Codec.GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    return _compressor(codec)(data)


DEFAULT_MAX_DECOMPRESSED = 64 << 20


def decompress(codec: Codec, data: bytes | memoryview, max_bytes: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """Decompress a wrapper's value, refusing output over `max_bytes` (a gzip bomb of a
    few KiB must not make the broker allocate gigabytes)."""
    if codec is Codec.NONE:
        return bytes(data)
    try:
        if codec is Codec.GZIP:
            out = _gunzip_bounded(data, max_bytes)
        elif codec is Codec.LZ4:
            out = _lz4_bounded(data, max_bytes)
        elif codec is Codec.ZSTD:
            import zstandard  # type: ignore[import-not-found]

            with zstandard.ZstdDecompressor().stream_reader(bytes(data)) as reader:
                out, chunk = bytearray(), b"x"
                while chunk and len(out) <= max_bytes:
                    chunk = reader.read(max_bytes + 1 - len(out))
                    out += chunk
                out = bytes(out)
        elif codec is Codec.SNAPPY:
            out = _snappy_bounded(data, max_bytes)
        else:
            raise InvalidMessage(f"unknown compression codec {int(codec)}")
    except InvalidMessage:
        raise
    except ImportError as exc:  # the bounded readers import their packages here
        raise _missing(codec) from exc
    except Exception as exc:  # every codec library has its own error classes
        raise InvalidMessage(f"cannot decompress a {codec.name.lower()} entry: {exc}") from exc
    if len(out) > max_bytes:
        raise InvalidMessage(f"a {codec.name.lower()} entry decompresses to more than {max_bytes} bytes")
    return out


def _gunzip_bounded(data: bytes | memoryview, max_bytes: int) -> bytes:
    """gzip.decompress with a bound on the output, member by member; zlib checks each
    member's trailer CRC and length."""
    out = bytearray()
    rest = bytes(data)
    if not rest:
        raise InvalidMessage("cannot decompress a gzip entry: empty value")
    while rest:
        d = zlib.decompressobj(wbits=31)
        out += d.decompress(rest, max_bytes + 1 - len(out))
        if len(out) > max_bytes:
            raise InvalidMessage(f"a gzip entry decompresses to more than {max_bytes} bytes")
        if not d.eof:
            raise InvalidMessage("cannot decompress a gzip entry: truncated gzip stream")
        rest = d.unused_data
    return bytes(out)


def _lz4_bounded(data: bytes | memoryview, max_bytes: int) -> bytes:
    """One LZ4 frame (Kafka's and the producer's lz4 value) with a bound on the output.
    `lz4.frame.decompress` allocates all a frame holds before the caller can look: 128
    MiB for a frame of 270 KiB of zeros. Bytes after the frame are refused, where
    `lz4.frame.decompress` dropped them unread."""
    import lz4.frame  # type: ignore[import-not-found]

    decompressor = lz4.frame.LZ4FrameDecompressor()
    out = decompressor.decompress(bytes(data), max_bytes + 1)
    if len(out) > max_bytes:
        raise InvalidMessage(f"a lz4 entry decompresses to more than {max_bytes} bytes")
    if not decompressor.eof:
        raise InvalidMessage("cannot decompress a lz4 entry: truncated lz4 frame")
    if decompressor.unused_data:
        raise InvalidMessage(f"a lz4 entry holds {len(decompressor.unused_data)} bytes after its frame")
    return out


# Java's snappy framing (xerial snappy-java's SnappyOutputStream), which Kafka's Java
# producer and kafka-python write: a magic, a version and the oldest version that reads
# it, then blocks of a 4-byte big-endian length and raw snappy. librdkafka writes raw
# snappy and reads both; so does the broker.
XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_XERIAL_BLOCK = struct.Struct(">i")
_XERIAL_VERSION = 1


def _snappy_bounded(data: bytes | memoryview, max_bytes: int) -> bytes:
    """Raw snappy or xerial's framing of it, with a bound on the output: each raw
    block's declared length is checked before the library allocates it."""
    import cramjam  # type: ignore[import-not-found]

    data = memoryview(data)  # blocks are read in place: no copy of the batch or of a block
    if data[:len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        if _snappy_length(data) > max_bytes:
            raise InvalidMessage(f"a snappy entry declares more than {max_bytes} bytes")
        return bytes(cramjam.snappy.decompress_raw(data))
    if len(data) < _XERIAL_HEADER.size:
        raise InvalidMessage("cannot decompress a snappy entry: truncated xerial header")
    _, _, compatible = _XERIAL_HEADER.unpack_from(data)
    if compatible > _XERIAL_VERSION:
        raise InvalidMessage(f"cannot decompress a snappy entry: xerial framing version {compatible} is unknown")
    out, position = bytearray(), _XERIAL_HEADER.size
    while position < len(data):
        if position + _XERIAL_BLOCK.size > len(data):
            raise InvalidMessage("cannot decompress a snappy entry: truncated xerial block length")
        (size,) = _XERIAL_BLOCK.unpack_from(data, position)
        position += _XERIAL_BLOCK.size
        block = data[position:position + size]
        if size < 0 or len(block) < size:
            raise InvalidMessage(f"cannot decompress a snappy entry: a xerial block of {size} bytes is cut")
        if len(out) + _snappy_length(block) > max_bytes:
            raise InvalidMessage(f"a snappy entry declares more than {max_bytes} bytes")
        out += cramjam.snappy.decompress_raw(block)
        position += size
    return bytes(out)


def _snappy_length(data: memoryview) -> int:
    """The uncompressed length a raw snappy block declares (its leading varint), which
    the library allocates before it decodes a byte: checked first, so a six-byte value
    cannot ask for gigabytes. (cramjam's `decompress_raw_len` refuses a length past 4 GiB
    with its own error instead of returning it, and reads an empty block as 0.)"""
    length = shift = 0
    for byte in data[:5]:
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return length
        shift += 7
    raise InvalidMessage("cannot decompress a snappy entry: no length in its header")
