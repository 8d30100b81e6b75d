"""The answers to the clients' requests (docs/protocol.md): produce and fetch
responses, the per-partition results of the MULTI* requests, offsets and metadata."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import NamedTuple

from broker.common.errors import ErrorCode, LogbusError, error_for
from broker.common.protocol.frames import Body
from broker.common.listeners import Endpoint
from broker.common.protocol.primitives import Reader, Writer

_OFFSETS = struct.Struct(">qq")  # base_offset, next_offset

# Enum members as constants on a hot path (docs/architecture.md, "Enum members on hot paths").
_OK = ErrorCode.NONE


class ProduceResponse(NamedTuple):
    """A tuple: one per acknowledged PRODUCE on the broker's produce path."""

    base_offset: int
    next_offset: int

    def encode(self) -> bytes:
        return _OFFSETS.pack(*self)

    def encode_parts(self) -> Body:
        return [self.encode()]

    @classmethod
    def decode(cls, r: Reader) -> "ProduceResponse":
        return cls(r.int64(), r.int64())


@dataclass(frozen=True)
class RecordCount:
    """RECORD_COUNT's answer: `records` have offsets in [start, end), the range asked
    for clamped to the log (start raised to its earliest offset, end lowered to its
    visible end)."""

    records: int
    start: int
    end: int

    def encode(self) -> bytes:
        return bytes(Writer().int64(self.records).int64(self.start).int64(self.end).buf)

    @classmethod
    def decode(cls, r: Reader) -> "RecordCount":
        answer = cls(r.int64(), r.int64(), r.int64())
        r.done()
        return answer


@dataclass(frozen=True)
class ProducerIdResponse:
    """A producer id no other producer has, and its first epoch (0)."""

    producer_id: int
    epoch: int

    def encode(self) -> bytes:
        return bytes(Writer().int64(self.producer_id).int16(self.epoch).buf)

    @classmethod
    def decode(cls, r: Reader) -> "ProducerIdResponse":
        response = cls(r.int64(), r.int16())
        r.done()
        return response


FETCH_RESPONSE_HEAD = struct.Struct(">qi")  # version 0: high_watermark, set_size
FETCH_RESPONSE_HEAD_V1 = struct.Struct(">qqi")  # version 1: high_watermark, set_offset, set_size
FETCH_VERSION = 1  # what clients send: a fetch at any record's offset (docs/protocol.md, FETCH)


@dataclass(frozen=True)
class FetchResponse:
    """A fetched set and where it starts: `set_offset` is the offset of its first byte
    (version 1; at or below the offset asked for, when that is a record inside an
    entry). Version 0 does not carry it: the set starts at the offset asked for, which
    a reader passes as `requested`."""

    high_watermark: int
    messages: bytes | memoryview  # or, in the broker, the file region holding them
    set_offset: int = -1
    version: int = FETCH_VERSION

    def encode_parts(self) -> Body:
        if self.version >= 1:
            return [FETCH_RESPONSE_HEAD_V1.pack(self.high_watermark, self.set_offset, len(self.messages)), self.messages]
        return [FETCH_RESPONSE_HEAD.pack(self.high_watermark, len(self.messages)), self.messages]

    @classmethod
    def read(cls, r: Reader, version: int = FETCH_VERSION, requested: int = -1) -> "FetchResponse":
        high_watermark = r.int64()
        set_offset = r.int64() if version >= 1 else requested
        return cls(high_watermark, r.raw(r.int32()), set_offset, version)


@dataclass(frozen=True)
class PartitionResult:
    """One entry of a MULTI* response: the value, or the error it carries."""

    error_code: int
    value: object = None
    message: str = ""

    def unwrap(self):
        if self.error_code != _OK:
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
        if result.error_code != _OK:
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


def decode_multifetch(r: Reader, version: int = FETCH_VERSION) -> list[PartitionResult]:
    return _decode_results(r, lambda reader: FetchResponse.read(reader, version))


def decode_multiproduce(r: Reader) -> list[PartitionResult]:
    return _decode_results(r, ProduceResponse.decode)


def _decode_results(r: Reader, decode_value) -> list[PartitionResult]:
    return [_decode_result(r, decode_value) for _ in range(r.int16())]


def _decode_result(r: Reader, decode_value) -> PartitionResult:
    code = r.int16()
    if code == _OK:
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
    """A live broker: the address of the listener it was asked on (METADATA) or of its
    inter-broker listener (ZooKeeper); with its registration, every listener's
    advertised endpoint and the principal it authenticates as (docs/zookeeper.md) —
    neither of which travels in METADATA."""

    broker_id: int
    host: str
    port: int
    endpoints: tuple[Endpoint, ...] = ()
    principal: str = ""

    def at(self, listener: str | None) -> "BrokerInfo":
        """This broker as reached on `listener` (None: its default address)."""
        if listener is None:
            return self
        for endpoint in self.endpoints:
            if endpoint.name == listener.upper():
                return BrokerInfo(self.broker_id, endpoint.host, endpoint.port, self.endpoints, self.principal)
        names = ", ".join(e.name for e in self.endpoints) or "none registered"
        raise ConnectionError(f"broker {self.broker_id} has no listener named {listener!r} ({names})")


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
