"""The requests clients send (docs/protocol.md): produce, fetch, offsets, metadata,
topic creation — each a frozen dataclass that encodes and decodes its body (PRODUCE,
one per request on the broker's hot path, a NamedTuple)."""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

from broker.common.errors import InvalidRequest
from broker.common.protocol.primitives import ApiKey, Reader, Writer
from broker.common.protocol.replication import LeaderEpochEndRequest, ReplicaFetchRequest
from broker.common.protocol.security import SaslAuthenticateRequest, SaslHandshakeRequest


class ProduceRequest(NamedTuple):
    """A tuple, made in C when decoded: one per request on the broker's produce path
    (`decode`: one unpack before the topic, one after it)."""

    acks: int
    timeout_ms: int
    topic: str
    partition: int
    messages: bytes | memoryview
    API = ApiKey.PRODUCE

    def encode(self) -> bytes:
        return bytes(
            Writer().int8(self.acks).int32(self.timeout_ms).string(self.topic).int32(self.partition).sized(self.messages).buf
        )

    @classmethod
    def decode(cls, r: Reader) -> "ProduceRequest":
        """A body that does not fit the one shape of a valid request is read field by
        field (`_read`), which says what is wrong with it."""
        view, pos = r.view, r.pos
        try:
            acks, timeout_ms, n = _PRODUCE_HEAD.unpack_from(view, pos)
            topic_end = pos + _PRODUCE_HEAD.size + n
            partition, size = _PRODUCE_TAIL.unpack_from(view, topic_end)
            start = topic_end + _PRODUCE_TAIL.size
            if n >= 0 and size >= 0 and start + size == len(view) and -1 <= acks <= 1:  # acks 0, 1 or -1
                topic = str(view[pos + _PRODUCE_HEAD.size : topic_end], "utf-8")
                r.pos = len(view)
                return _new_produce((acks, timeout_ms, topic, partition, view[start:]))
        except (struct.error, UnicodeDecodeError):
            pass
        return cls._read(r)

    @classmethod
    def _read(cls, r: Reader) -> "ProduceRequest":
        acks, timeout_ms, topic, partition = r.int8(), r.int32(), r.string(), r.int32()
        messages = r.raw(r.int32())
        r.done()
        return cls(_check_acks(acks), timeout_ms, topic, partition, messages)


_PRODUCE_HEAD = struct.Struct(">bih")  # acks, timeout_ms, the topic's length
_PRODUCE_TAIL = struct.Struct(">ii")  # partition, the set's size
_new_produce = functools.partial(tuple.__new__, ProduceRequest)


def _check_acks(acks: int) -> int:
    if acks not in (0, 1, -1):
        raise InvalidRequest(f"acks must be 0, 1 or -1, not {acks}")
    return acks


@dataclass(frozen=True)
class FetchRequest:
    API: ClassVar[ApiKey] = ApiKey.FETCH
    topic: str
    partition: int
    offset: int
    max_bytes: int
    max_wait_ms: int = 0
    min_bytes: int = 0

    def write(self, w: Writer) -> Writer:
        return w.string(self.topic).int32(self.partition).int64(self.offset).int32(self.max_bytes).int32(
            self.max_wait_ms
        ).int32(self.min_bytes)

    def encode(self) -> bytes:
        return bytes(self.write(Writer()).buf)

    @classmethod
    def read(cls, r: Reader) -> "FetchRequest":
        req = cls(r.string(), r.int32(), r.int64(), r.int32(), r.int32(), r.int32())
        if req.max_bytes < 0 or req.max_wait_ms < 0 or req.min_bytes < 0:
            raise InvalidRequest(f"negative max_bytes, max_wait_ms or min_bytes in {req}")
        return req

    @classmethod
    def decode(cls, r: Reader) -> "FetchRequest":
        req = cls.read(r)
        r.done()
        return req


@dataclass(frozen=True)
class MultiFetchRequest:
    """Several fetches in one round trip. The broker answers when any one of them has
    reached its `min_bytes`, or when the longest `max_wait_ms` has passed."""

    API: ClassVar[ApiKey] = ApiKey.MULTIFETCH
    fetches: list[FetchRequest]

    def encode(self) -> bytes:
        w = Writer().int16(len(self.fetches))
        for f in self.fetches:
            f.write(w)
        return bytes(w.buf)

    @classmethod
    def decode(cls, r: Reader) -> "MultiFetchRequest":
        n = r.int16()
        if n < 0:
            raise InvalidRequest(f"negative fetch count {n}")
        fetches = [FetchRequest.read(r) for _ in range(n)]
        r.done()
        return cls(fetches)


@dataclass(frozen=True)
class ProducePart:
    topic: str
    partition: int
    messages: bytes | memoryview


@dataclass(frozen=True)
class MultiProduceRequest:
    API: ClassVar[ApiKey] = ApiKey.MULTIPRODUCE
    acks: int
    timeout_ms: int
    parts: list[ProducePart]

    def encode(self) -> bytes:
        w = Writer().int8(self.acks).int32(self.timeout_ms).int16(len(self.parts))
        for p in self.parts:
            w.string(p.topic).int32(p.partition).sized(p.messages)
        return bytes(w.buf)

    @classmethod
    def decode(cls, r: Reader) -> "MultiProduceRequest":
        acks, timeout_ms, n = r.int8(), r.int32(), r.int16()
        if n < 0:
            raise InvalidRequest(f"negative part count {n}")
        parts = []
        for _ in range(n):
            topic, partition = r.string(), r.int32()
            parts.append(ProducePart(topic, partition, r.raw(r.int32())))
        r.done()
        return cls(_check_acks(acks), timeout_ms, parts)


@dataclass(frozen=True)
class OffsetsRequest:
    API: ClassVar[ApiKey] = ApiKey.OFFSETS
    topic: str
    partition: int
    time: int
    max_offsets: int = 1

    def encode(self) -> bytes:
        return bytes(Writer().string(self.topic).int32(self.partition).int64(self.time).int32(self.max_offsets).buf)

    @classmethod
    def decode(cls, r: Reader) -> "OffsetsRequest":
        req = cls(r.string(), r.int32(), r.int64(), r.int32())
        r.done()
        if req.max_offsets < 0:
            raise InvalidRequest(f"negative max_offsets {req.max_offsets}")
        return req


@dataclass(frozen=True)
class RecordCountRequest:
    """How many records have offsets in [start_offset, end_offset): lag in records,
    since offsets are positions and not dense (docs/architecture.md, "Offsets")."""

    API: ClassVar[ApiKey] = ApiKey.RECORD_COUNT
    topic: str
    partition: int
    start_offset: int
    end_offset: int = -1  # -1: the visible end (high watermark)

    def encode(self) -> bytes:
        return bytes(Writer().string(self.topic).int32(self.partition).int64(self.start_offset).int64(self.end_offset).buf)

    @classmethod
    def decode(cls, r: Reader) -> "RecordCountRequest":
        req = cls(r.string(), r.int32(), r.int64(), r.int64())
        r.done()
        if req.start_offset < 0 or req.end_offset < -1:
            raise InvalidRequest(f"record count from {req.start_offset} to {req.end_offset}: offsets are >= 0 "
                                 f"(end_offset -1: the visible end)")
        if 0 <= req.end_offset < req.start_offset:
            raise InvalidRequest(f"record count from {req.start_offset} to {req.end_offset}: end_offset is below "
                                 f"start_offset")
        return req


@dataclass(frozen=True)
class MetadataRequest:
    API: ClassVar[ApiKey] = ApiKey.METADATA
    topics: list[str] = field(default_factory=list)

    def encode(self) -> bytes:
        w = Writer().int32(len(self.topics))
        for t in self.topics:
            w.string(t)
        return bytes(w.buf)

    @classmethod
    def decode(cls, r: Reader) -> "MetadataRequest":
        topics = [r.string() for _ in range(r.count())]
        r.done()
        return cls(topics)


@dataclass(frozen=True)
class CreateTopicRequest:
    API: ClassVar[ApiKey] = ApiKey.CREATE_TOPIC
    topic: str
    partitions: int
    replication_factor: int = 1

    def encode(self) -> bytes:
        return bytes(Writer().string(self.topic).int32(self.partitions).int16(self.replication_factor).buf)

    @classmethod
    def decode(cls, r: Reader) -> "CreateTopicRequest":
        req = cls(r.string(), r.int32(), r.int16())
        r.done()
        return req


@dataclass(frozen=True)
class DeleteTopicRequest:
    """Delete a topic (docs/protocol.md, DELETE_TOPIC): answered once the deletion is
    complete, or RequestTimedOut after `timeout_ms` (<= 0: wait for it)."""

    API: ClassVar[ApiKey] = ApiKey.DELETE_TOPIC
    topic: str
    timeout_ms: int = 30_000

    def encode(self) -> bytes:
        return bytes(Writer().string(self.topic).int32(self.timeout_ms).buf)

    @classmethod
    def decode(cls, r: Reader) -> "DeleteTopicRequest":
        req = cls(r.string(), r.int32())
        r.done()
        return req


@dataclass(frozen=True)
class InitProducerIdRequest:
    """An idempotent producer asks for its identity (docs/protocol.md, INIT_PRODUCER_ID):
    an empty body; the answer is `ProducerIdResponse`."""

    API: ClassVar[ApiKey] = ApiKey.INIT_PRODUCER_ID

    def encode(self) -> bytes:
        return b""

    @classmethod
    def decode(cls, r: Reader) -> "InitProducerIdRequest":
        r.done()
        return cls()


REQUEST_TYPES: dict[int, type] = {
    cls.API: cls
    for cls in (
        ProduceRequest, FetchRequest, MultiFetchRequest, MultiProduceRequest, OffsetsRequest,
        MetadataRequest, CreateTopicRequest, ReplicaFetchRequest, LeaderEpochEndRequest, InitProducerIdRequest,
        SaslHandshakeRequest, SaslAuthenticateRequest, RecordCountRequest, DeleteTopicRequest,
    )
}
