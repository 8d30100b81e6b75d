"""Offsets of partitions: what each partition's leader answers to OFFSETS
(docs/protocol.md) and what a consumer group committed in ZooKeeper (docs/zookeeper.md).

Leader offsets go through the one metadata/connection layer (`ConnectionPool.call_leader`:
watched metadata, cached connections, a retry after a leader change). Group offsets are
read and advanced with the layout's codecs and compare-and-set (`broker.common.zklayout`);
`lag` combines the two with a count of records and is pure; `records_lag` has the
leaders count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kazoo.client import KazooClient

from broker.client.cluster import ConnectionPool
from broker.common.errors import UnknownTopic
from broker.common.protocol import EARLIEST, LATEST, RecordCount
from broker.common.zklayout import advance_offset, read_offset

LAST_SEGMENT_TIME = 1 << 62  # a time after every segment: OFFSETS answers every segment start


@dataclass(frozen=True)
class PartitionOffsets:
    """Offsets of one partition as its leader sees them now."""

    topic: str
    partition: int
    leader: int  # the current leader; the preferred (first) replica while there is none
    earliest: int
    latest: int


def offsets_before(pool: ConnectionPool, topic: str, partition: int, time_ms: int, max_offsets: int = 1) -> list[int]:
    """OFFSETS at the leader: `LATEST` (-1), `EARLIEST` (-2), or segment starts before a time."""
    return pool.call_leader(topic, partition, lambda conn: conn.offsets(topic, partition, time_ms, max_offsets))


def earliest(pool: ConnectionPool, topic: str, partition: int) -> int:
    return offsets_before(pool, topic, partition, EARLIEST)[0]


def latest(pool: ConnectionPool, topic: str, partition: int) -> int:
    return offsets_before(pool, topic, partition, LATEST)[0]


def records_between(pool: ConnectionPool, topic: str, partition: int, start: int, end: int = -1) -> RecordCount:
    """RECORD_COUNT at the leader: the records with offsets in [start, end) (end -1: the
    high watermark), the range clamped to what the partition holds — lag in records,
    since offsets are not dense (docs/architecture.md, "Offsets")."""
    return pool.call_leader(topic, partition, lambda conn: conn.record_count(topic, partition, start, end))


def assigned_leaders(pool: ConnectionPool, topic: str) -> dict[int, int]:
    """partition -> assigned leader broker id (first replica), live or not."""
    assignment = pool.metadata.assignment(topic)
    if assignment is None:
        raise UnknownTopic(f"topic {topic!r} does not exist")
    return {p: replicas[0] for p, replicas in sorted(assignment.items())}


def partition_offsets(pool: ConnectionPool, topic: str) -> dict[int, PartitionOffsets]:
    """Earliest and latest offsets of every partition of `topic`, from each leader
    (the latest is the leader's high watermark: what consumers can read)."""
    current = pool.metadata.partitions(topic) or {}
    return {
        p: PartitionOffsets(topic, p, current[p] if current.get(p, -1) >= 0 else preferred,
                            earliest(pool, topic, p), latest(pool, topic, p))
        for p, preferred in assigned_leaders(pool, topic).items()
    }


def segment_starts(pool: ConnectionPool, topic: str, partition: int, max_offsets: int = 10_000) -> list[int]:
    """Start offsets of the partition's segments (message boundaries), ascending."""
    starts = offsets_before(pool, topic, partition, LAST_SEGMENT_TIME, max_offsets)
    end = latest(pool, topic, partition)
    return sorted(o for o in starts if o != end)


def has_data_after(pool: ConnectionPool, topic: str, partition: int, time_ms: int) -> bool:
    """Whether the partition holds a flushed message with a timestamp > `time_ms`, from
    one OFFSETS(time) lookup: the broker answers the end offset when all data is at or
    before `time_ms`, and segment starts otherwise (docs/storage.md,
    "Offsets before a time")."""
    answer = offsets_before(pool, topic, partition, time_ms, 1)
    end = latest(pool, topic, partition)
    if not answer:
        return end > earliest(pool, topic, partition)  # every segment starts after time_ms
    return answer[0] != end


# ------------------------------------------------------------------- group offsets


def group_offsets(zk: KazooClient, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """The group's committed next offsets; partitions without one are absent."""
    committed = {p: read_offset(zk, group, topic, p) for p in partitions}
    return {p: offset for p, offset in committed.items() if offset is not None}


def advance_group_offsets(zk: KazooClient, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Move the group's offsets forward, never back (compare-and-set per partition:
    overlapping runs that mirror their loads may write at the same time)."""
    for partition, offset in offsets.items():
        advance_offset(zk, group, topic, int(partition), int(offset))


RecordCounter = Callable[[int, int, int], int]
"""(partition, start, end) -> how many records have offsets in [start, end)."""


def lag(offsets: dict[int, PartitionOffsets], committed: dict[int, int], count: RecordCounter,
        missing: str = "earliest") -> dict[int, int]:
    """Records between the group's offset and the end, per partition, as `count` counts
    them: offsets are unique but not dense (docs/architecture.md, "Offsets"), so bytes
    between two offsets are not records. A partition the group never committed counts
    from `missing` ('earliest' or 'latest'); an offset before the earliest (deleted by
    retention) counts from the earliest; one at or past the end is no lag."""
    if missing not in ("earliest", "latest"):
        raise ValueError(f"missing must be 'earliest' or 'latest', not {missing!r}")
    out = {}
    for p, o in offsets.items():
        start = max(committed.get(p, o.earliest if missing == "earliest" else o.latest), o.earliest)
        out[p] = count(p, start, o.latest) if start < o.latest else 0
    return out


def records_lag(pool: ConnectionPool, topic: str, offsets: dict[int, PartitionOffsets], committed: dict[int, int],
                missing: str = "earliest") -> dict[int, int]:
    """`lag` with each partition's leader counting the records (RECORD_COUNT)."""
    return lag(offsets, committed, lambda p, start, end: records_between(pool, topic, p, start, end).records, missing)
