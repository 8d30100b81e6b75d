"""Request and response codecs of the wire protocol (docs/protocol.md, a contract).

Frames are `int32 size` + payload, big-endian, strings as `int16 length + UTF-8`.
Server and clients both use this module; it knows nothing of sockets or logs.
A response whose error code is not 0 carries a string explaining the error in place of
its body (in MULTI* responses, per entry), so a client can show the broker's reason.
"""

from __future__ import annotations

import enum
import re
import struct
from dataclasses import dataclass, field
from typing import ClassVar

from broker.errors import ErrorCode, InvalidRequest, InvalidTopicName, LogbusError, error_for

API_VERSION = 0
SIZE = struct.Struct(">i")
REQUEST_HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id (+ client_id)
RESPONSE_HEADER = struct.Struct(">iih")  # size, correlation_id, error_code
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


# ---------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str


def encode_request(api_key: ApiKey, correlation_id: int, client_id: str, body: bytes | bytearray,
                   api_version: int = API_VERSION) -> bytes:
    w = Writer()
    w.buf += SIZE.pack(0)
    w.buf += REQUEST_HEADER.pack(api_key, api_version, correlation_id)
    w.string(client_id)
    w.raw(body)
    SIZE.pack_into(w.buf, 0, len(w.buf) - 4)
    return bytes(w.buf)


def decode_request_header(frame: bytes | memoryview) -> tuple[RequestHeader, Reader]:
    """Parse the header of a frame (without its size field)."""
    r = Reader(frame)
    api_key, api_version, correlation_id = r._unpack(REQUEST_HEADER)
    return RequestHeader(api_key, api_version, correlation_id, r.string()), r


@dataclass(frozen=True)
class ProduceRequest:
    API: ClassVar[ApiKey] = ApiKey.PRODUCE
    acks: int
    timeout_ms: int
    topic: str
    partition: int
    messages: bytes | memoryview

    def encode(self) -> bytes:
        return bytes(
            Writer().int8(self.acks).int32(self.timeout_ms).string(self.topic).int32(self.partition).sized(self.messages).buf
        )

    @classmethod
    def decode(cls, r: Reader) -> "ProduceRequest":
        acks, timeout_ms, topic, partition = r.int8(), r.int32(), r.string(), r.int32()
        messages = r.raw(r.int32())
        r.done()
        return cls(_check_acks(acks), timeout_ms, topic, partition, messages)


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


_REPLICA_FETCH_PARTITION = struct.Struct(">iiqqi")  # partition, leader_epoch, fetch_offset, flushed_offset, max_bytes


@dataclass(frozen=True)
class ReplicaFetchPartition:
    """One partition of a follower's fetch. `fetch_offset` is the follower's log end
    (where it wants bytes from) and `flushed_offset` its flushed end: the leader records
    both, which is how it knows what each follower has (ISR, high watermark)."""

    topic: str
    partition: int
    leader_epoch: int
    fetch_offset: int
    flushed_offset: int
    max_bytes: int

    def write(self, w: Writer) -> Writer:
        return w.string(self.topic).int32(self.partition).int32(self.leader_epoch).int64(self.fetch_offset).int64(
            self.flushed_offset).int32(self.max_bytes)

    @classmethod
    def read(cls, r: Reader) -> "ReplicaFetchPartition":
        part = cls(r.string(), *r._unpack(_REPLICA_FETCH_PARTITION))  # one unpack: n of them per request
        if part.max_bytes < 0:
            raise InvalidRequest(f"negative max_bytes in {part}")
        return part


@dataclass(frozen=True)
class ReplicaFetchRequest:
    """A follower's fetch from one leader, for every partition it follows there (Kafka's
    fetcher per source broker): one connection and one long poll per leader, however
    many partitions. A `full` request lists them all and starts the follower's fetch
    session on the leader; the requests after it (`full` false) list only the
    partitions whose fetch or flushed offset changed — the leader keeps the others'
    last entries (Kafka's incremental fetch sessions, KIP-227). The leader answers when
    any session partition has bytes, an error or a new high watermark for the follower,
    or after `max_wait_ms`; the answer names only those partitions."""

    API: ClassVar[ApiKey] = ApiKey.REPLICA_FETCH
    replica_id: int
    max_wait_ms: int
    full: bool
    partitions: tuple[ReplicaFetchPartition, ...]

    def encode(self) -> bytes:
        w = Writer().int32(self.replica_id).int32(self.max_wait_ms).int8(int(self.full)).int16(len(self.partitions))
        for part in self.partitions:
            part.write(w)
        return bytes(w.buf)

    @classmethod
    def decode(cls, r: Reader) -> "ReplicaFetchRequest":
        replica_id, max_wait_ms, full, n = r.int32(), r.int32(), r.int8(), r.int16()
        if max_wait_ms < 0 or n < 0 or full not in (0, 1):
            raise InvalidRequest(f"negative max_wait_ms ({max_wait_ms}) or partition count ({n}), or full={full}, "
                                 "in a replica fetch")
        req = cls(replica_id, max_wait_ms, bool(full), tuple(ReplicaFetchPartition.read(r) for _ in range(n)))
        r.done()
        return req


@dataclass(frozen=True)
class LeaderEpochEndRequest:
    """KIP-101: where does `leader_epoch` end in the leader's log?"""

    API: ClassVar[ApiKey] = ApiKey.LEADER_EPOCH_END
    topic: str
    partition: int
    leader_epoch: int

    def encode(self) -> bytes:
        return bytes(Writer().string(self.topic).int32(self.partition).int32(self.leader_epoch).buf)

    @classmethod
    def decode(cls, r: Reader) -> "LeaderEpochEndRequest":
        req = cls(r.string(), r.int32(), r.int32())
        r.done()
        return req


REQUEST_TYPES: dict[int, type] = {
    cls.API: cls
    for cls in (
        ProduceRequest, FetchRequest, MultiFetchRequest, MultiProduceRequest, OffsetsRequest,
        MetadataRequest, CreateTopicRequest, ReplicaFetchRequest, LeaderEpochEndRequest,
    )
}

# --------------------------------------------------------------------------- responses


# A response body is a list of parts: bytes, and in fetch responses the message set as
# given — bytes in clients and tests, a file region the broker sends with sendfile (any
# object with a length). `response_frame` puts the header in front.
Body = list


def response_header(correlation_id: int, error_code: int, body_size: int) -> bytes:
    return RESPONSE_HEADER.pack(body_size + 6, correlation_id, error_code)


def response_frame(correlation_id: int, body: Body) -> Body:
    """The frame of a successful response, the header joined to the first part so that a
    small response is one write."""
    if len(body) == 1 and type(body[0]) is bytes:  # most responses: one write, nothing to add up
        return [RESPONSE_HEADER.pack(len(body[0]) + 6, correlation_id, ErrorCode.NONE) + body[0]]
    head = response_header(correlation_id, ErrorCode.NONE, sum(map(len, body)))
    if body and isinstance(body[0], bytes):
        return [head + body[0], *body[1:]]
    return [head, *body]


def error_response(correlation_id: int, error_code: int, message: str) -> bytes:
    body = Writer().string(message[:2000]).buf
    return response_header(correlation_id, error_code, len(body)) + body


def decode_response_header(frame: bytes | memoryview) -> tuple[int, int, Reader]:
    """(correlation_id, error_code, reader at the body) of a frame without its size."""
    r = Reader(frame)
    return r.int32(), r.int16(), r


def raise_for_error(error_code: int, r: Reader) -> None:
    """Raise the error a response carries, with the broker's explanation."""
    if error_code != ErrorCode.NONE:
        try:
            message = r.string()
        except InvalidRequest:
            message = ""
        raise error_for(error_code, message)


@dataclass(frozen=True)
class ProduceResponse:
    base_offset: int
    next_offset: int

    def encode(self) -> bytes:
        return _I64.pack(self.base_offset) + _I64.pack(self.next_offset)

    def encode_parts(self) -> Body:
        return [self.encode()]

    @classmethod
    def decode(cls, r: Reader) -> "ProduceResponse":
        return cls(r.int64(), r.int64())


FETCH_RESPONSE_HEAD = struct.Struct(">qi")  # high_watermark, set_size


@dataclass(frozen=True)
class FetchResponse:
    high_watermark: int
    messages: bytes | memoryview  # or, in the broker, the file region holding them

    def encode_parts(self) -> Body:
        return [FETCH_RESPONSE_HEAD.pack(self.high_watermark, len(self.messages)), self.messages]

    @classmethod
    def read(cls, r: Reader) -> "FetchResponse":
        high_watermark = r.int64()
        return cls(high_watermark, r.raw(r.int32()))


REPLICA_FETCH_RESPONSE_HEAD = struct.Struct(">qii")  # high_watermark, leader_epoch, set_size


@dataclass(frozen=True)
class ReplicaFetchResponse:
    high_watermark: int
    leader_epoch: int
    messages: bytes | memoryview  # or, in the broker, the file region holding them

    def encode_parts(self) -> Body:
        return [REPLICA_FETCH_RESPONSE_HEAD.pack(self.high_watermark, self.leader_epoch, len(self.messages)),
                self.messages]

    @classmethod
    def decode(cls, r: Reader) -> "ReplicaFetchResponse":
        high_watermark, leader_epoch, size = r._unpack(REPLICA_FETCH_RESPONSE_HEAD)
        return cls(high_watermark, leader_epoch, r.raw(size))


@dataclass(frozen=True)
class LeaderEpochEndResponse:
    """The largest epoch <= the asked one that the leader knows, and the offset where it
    ends: the start of the next epoch, or the log end for the current epoch."""

    epoch: int
    end_offset: int

    def encode(self) -> bytes:
        return _I32.pack(self.epoch) + _I64.pack(self.end_offset)

    @classmethod
    def decode(cls, r: Reader) -> "LeaderEpochEndResponse":
        return cls(r.int32(), r.int64())


@dataclass(frozen=True)
class PartitionResult:
    """One entry of a MULTI* response: the value, or the error it carries."""

    error_code: int
    value: object = None
    message: str = ""

    def unwrap(self):
        if self.error_code != ErrorCode.NONE:
            raise error_for(self.error_code, self.message)
        return self.value

    @classmethod
    def failed(cls, error: LogbusError) -> "PartitionResult":
        return cls(error.code, None, str(error))


def encode_results(results: list[PartitionResult], keys: list[tuple[str, int]] | None = None) -> Body:
    """A MULTI* response body: int16 n, n × (int16 error_code, the value's body — or the
    error string); with `keys`, each entry starts with its topic and int32 partition. A
    value's message set (a fetch's file region) stays its own part."""
    body: Body = []
    w = Writer().int16(len(results))
    for i, result in enumerate(results):
        if keys is not None:
            w.string(keys[i][0]).int32(keys[i][1])
        w.int16(result.error_code)
        if result.error_code != ErrorCode.NONE:
            w.string(result.message)
            continue
        for part in result.value.encode_parts():
            if isinstance(part, (bytes, bytearray, memoryview)):
                w.raw(part)
            elif part.length:  # an empty file region adds nothing to send
                body += [bytes(w.buf), part]
                w = Writer()
    if w.buf:
        body.append(bytes(w.buf))
    return body


def decode_multifetch(r: Reader) -> list[PartitionResult]:
    return _decode_results(r, FetchResponse.read)


def decode_multiproduce(r: Reader) -> list[PartitionResult]:
    return _decode_results(r, ProduceResponse.decode)


def decode_replica_fetch(r: Reader) -> list[tuple[tuple[str, int], PartitionResult]]:
    """A REPLICA_FETCH answer: (topic, partition) and a `ReplicaFetchResponse` or an error,
    for the partitions the leader has something to say about."""
    entries = []
    for _ in range(r.int16()):
        key = (r.string(), r.int32())
        entries.append((key, _decode_result(r, ReplicaFetchResponse.decode)))
    return entries


def _decode_results(r: Reader, decode_value) -> list[PartitionResult]:
    return [_decode_result(r, decode_value) for _ in range(r.int16())]


def _decode_result(r: Reader, decode_value) -> PartitionResult:
    code = r.int16()
    if code == ErrorCode.NONE:
        return PartitionResult(code, decode_value(r))
    return PartitionResult(code, None, r.string())


def decode_offsets(r: Reader) -> list[int]:
    return [r.int64() for _ in range(r.count())]


def encode_offsets(offsets: list[int]) -> bytes:
    w = Writer().int32(len(offsets))
    for o in offsets:
        w.int64(o)
    return bytes(w.buf)


@dataclass(frozen=True)
class BrokerInfo:
    broker_id: int
    host: str
    port: int


@dataclass(frozen=True)
class PartitionMetadata:
    partition: int
    leader: int  # -1 while the partition has no live leader (offline)
    replicas: list[int]
    earliest: int = -1  # offsets only from the partition's leader, -1 elsewhere
    latest: int = -1
    leader_epoch: int = 0  # version 1 only (a version 0 answer decodes as 0)
    isr: list[int] = field(default_factory=list)  # version 1 only (a version 0 answer decodes as [])


@dataclass(frozen=True)
class TopicMetadata:
    topic: str
    error_code: int
    partitions: list[PartitionMetadata]


METADATA_VERSION = 1  # clients ask for version 1: leader epoch and ISR per partition


@dataclass(frozen=True)
class MetadataResponse:
    brokers: list[BrokerInfo]
    topics: list[TopicMetadata]

    def encode(self, version: int = 0) -> bytes:
        w = Writer().int32(len(self.brokers))
        for b in self.brokers:
            w.int32(b.broker_id).string(b.host).int32(b.port)
        w.int32(len(self.topics))
        for t in self.topics:
            w.string(t.topic).int16(t.error_code).int32(len(t.partitions))
            for p in t.partitions:
                w.int32(p.partition).int32(p.leader).int16(len(p.replicas))
                for replica in p.replicas:
                    w.int32(replica)
                w.int64(p.earliest).int64(p.latest)
                if version >= 1:
                    w.int32(p.leader_epoch).int16(len(p.isr))
                    for member in p.isr:
                        w.int32(member)
        return bytes(w.buf)

    @classmethod
    def decode(cls, r: Reader, version: int = 0) -> "MetadataResponse":
        brokers = [BrokerInfo(r.int32(), r.string(), r.int32()) for _ in range(r.count())]
        topics = []
        for _ in range(r.count()):
            topic, code = r.string(), r.int16()
            partitions = []
            for _ in range(r.count()):
                partition, leader = r.int32(), r.int32()
                replicas = [r.int32() for _ in range(r.int16())]
                earliest, latest = r.int64(), r.int64()
                epoch, isr = 0, []
                if version >= 1:
                    epoch = r.int32()
                    isr = [r.int32() for _ in range(r.int16())]
                partitions.append(PartitionMetadata(partition, leader, replicas, earliest, latest, epoch, isr))
            topics.append(TopicMetadata(topic, code, partitions))
        return cls(brokers, topics)
