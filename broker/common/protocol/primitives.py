"""The wire protocol's primitives (docs/protocol.md, a contract): API keys, acks,
topic names, and sequential big-endian reads and writes. Frames are `int32 size` +
payload, strings `int16 length + UTF-8`."""

from __future__ import annotations

import enum
import re
import struct

from broker.common.errors import InvalidRequest, InvalidTopicName


API_VERSION = 0


SIZE = struct.Struct(">i")


_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    MULTIFETCH = 2
    MULTIPRODUCE = 3
    OFFSETS = 4
    METADATA = 5
    CREATE_TOPIC = 6
    REPLICA_FETCH = 7
    LEADER_EPOCH_END = 8
    INIT_PRODUCER_ID = 9
    SASL_HANDSHAKE = 10
    SASL_AUTHENTICATE = 11
    RECORD_COUNT = 12
    DELETE_TOPIC = 13


class Acks(enum.IntEnum):
    NONE = 0  # no response at all
    APPENDED = 1  # after the append to the log
    FLUSHED = -1  # after the fsync that covers the data


AUTO_PARTITIONS = -1  # CREATE_TOPIC partitions: create as a first produce would (num.partitions)


LATEST = -1  # OFFSETS time: the end of the log


EARLIEST = -2  # OFFSETS time: the start of the log


def check_topic_name(topic: str) -> str:
    """Topic names become directory names: `[A-Za-z0-9._-]{1,249}`, not `.` or `..`."""
    if not isinstance(topic, str) or not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
        raise InvalidTopicName(
            f"invalid topic name {topic!r}: use 1 to 249 of the characters A-Z a-z 0-9 . _ -, "
            "and not '.' or '..'"
        )
    return topic


class Reader:
    """Sequential big-endian reads over a frame; running short is an InvalidRequest."""

    __slots__ = ("view", "pos")

    def __init__(self, data: bytes | memoryview, pos: int = 0) -> None:
        self.view = memoryview(data)
        self.pos = pos

    def _unpack(self, fmt: struct.Struct) -> tuple:
        try:
            values = fmt.unpack_from(self.view, self.pos)
        except struct.error:
            raise InvalidRequest(f"frame ends early at byte {self.pos}") from None
        self.pos += fmt.size
        return values

    def int8(self) -> int:
        return self._unpack(_I8)[0]

    def int16(self) -> int:
        return self._unpack(_I16)[0]

    def int32(self) -> int:
        return self._unpack(_I32)[0]

    def int64(self) -> int:
        return self._unpack(_I64)[0]

    def raw(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.view):
            raise InvalidRequest(f"field of {n} bytes at byte {self.pos} runs past the frame end")
        chunk = self.view[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise InvalidRequest(f"negative string length at byte {self.pos - 2}")
        try:
            return str(self.raw(n), "utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(f"string at byte {self.pos - n} is not UTF-8") from None

    def count(self, limit: int = 100_000) -> int:
        n = self.int32()
        if not 0 <= n <= limit:
            raise InvalidRequest(f"impossible element count {n}")
        return n

    def done(self) -> None:
        if self.pos != len(self.view):
            raise InvalidRequest(f"{len(self.view) - self.pos} unexpected bytes at the end of the frame")


_I8, _I16, _I32, _I64 = (struct.Struct(f) for f in (">b", ">h", ">i", ">q"))


class Writer:
    """Builds a frame body in one bytearray."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def int8(self, v: int) -> "Writer":
        self.buf += _I8.pack(v)
        return self

    def int16(self, v: int) -> "Writer":
        self.buf += _I16.pack(v)
        return self

    def int32(self, v: int) -> "Writer":
        self.buf += _I32.pack(v)
        return self

    def int64(self, v: int) -> "Writer":
        self.buf += _I64.pack(v)
        return self

    def string(self, s: str) -> "Writer":
        data = s.encode("utf-8")
        if len(data) > 0x7FFF:
            raise ValueError(f"string of {len(data)} bytes is too long for the protocol")
        self.buf += _I16.pack(len(data))
        self.buf += data
        return self

    def raw(self, data: bytes | memoryview) -> "Writer":
        self.buf += data
        return self

    def sized(self, data: bytes | memoryview) -> "Writer":
        self.buf += _I32.pack(len(data))
        self.buf += data
        return self
