"""The requests only brokers send each other (docs/replication.md): a follower's
REPLICA_FETCH (a fetch session over every partition it follows on one leader) and
LEADER_EPOCH_END (KIP-101 truncation), with their answers."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

from broker.common.errors import InvalidRequest
from broker.common.protocol.frames import Body
from broker.common.protocol.primitives import ApiKey, Reader, Writer, _I32, _I64
from broker.common.protocol.responses import PartitionResult, _decode_result


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


def decode_replica_fetch(r: Reader) -> list[tuple[tuple[str, int], PartitionResult]]:
    """A REPLICA_FETCH answer: (topic, partition) and a `ReplicaFetchResponse` or an error,
    for the partitions the leader has something to say about."""
    entries = []
    for _ in range(r.int16()):
        key = (r.string(), r.int32())
        entries.append((key, _decode_result(r, ReplicaFetchResponse.decode)))
    return entries
