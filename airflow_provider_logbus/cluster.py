"""Plain-Python access to a logbus cluster for the provider (no Airflow, no Spark).

`LogbusCluster` finds partition leaders (ZooKeeper, or METADATA from static brokers),
asks each leader for earliest/latest offsets, reads and writes group offsets in
ZooKeeper and reads byte ranges of a partition. The hook wraps it for Airflow; the Spark
data source uses it on executors, where Airflow is not importable.
"""

from __future__ import annotations

import json
import logging
import struct
import threading
import time
from dataclasses import dataclass
from typing import Iterator

from broker.client.cluster import connect_zookeeper, parse_broker_list
from broker.client.connection import BrokerConnection
from broker.client.errors import ZooKeeperUnavailable
from broker.errors import LogbusError, NotLeaderForPartition, UnknownTopic
from broker.message import HEADER, SIZE_FIELD, scan
from broker.protocol import EARLIEST, LATEST, BrokerInfo
from broker.zklayout import BROKER_TOPICS, decode_assignment, offset_path, read_brokers, topic_path

logger = logging.getLogger(__name__)

DEFAULT_FETCH_BYTES = 8 << 20


class ClusterConfigError(ValueError):
    """The cluster address is missing or malformed."""


@dataclass(frozen=True)
class PartitionOffsets:
    """Offsets of one partition as its leader sees them now."""

    topic: str
    partition: int
    leader: int
    earliest: int
    latest: int


def parse_brokers(brokers: str | list) -> list[tuple[str, int]]:
    """'h1:9092,h2:9093', ['h1:9092'] or [('h1', 9092)] -> [(host, port)] (the clients'
    parser, with its errors as ClusterConfigError)."""
    if not isinstance(brokers, str):
        brokers = [f"{b[0]}:{b[1]}" if isinstance(b, (tuple, list)) else str(b) for b in brokers]
    try:
        return parse_broker_list(brokers)
    except ValueError as exc:
        raise ClusterConfigError(str(exc)) from None


class LogbusCluster:
    """A cluster seen through ZooKeeper (`zookeeper="h:p/chroot"`) or a static list of
    brokers (`brokers="h:p,h:p"`, answered with METADATA). Connections are cached;
    `close()` releases them. Thread-safe for reads (one lock around the caches)."""

    def __init__(self, zookeeper: str | None = None, brokers: str | list | None = None,
                 timeout: float = 15.0, client_id: str = "logbus-airflow") -> None:
        if not zookeeper and not brokers:
            raise ClusterConfigError("give a ZooKeeper connect string or a list of brokers")
        self.zookeeper = zookeeper or None
        self.static_brokers = parse_brokers(brokers) if brokers else []
        self.timeout = timeout
        self.client_id = client_id
        self._zk = None
        self._connections: dict[tuple[str, int], BrokerConnection] = {}
        self._lock = threading.Lock()  # guards _zk and _connections

    # ------------------------------------------------------------------ plumbing

    @property
    def zk(self):
        """A started KazooClient (only with a ZooKeeper connect string)."""
        with self._lock:
            if self._zk is None:
                if not self.zookeeper:
                    raise ClusterConfigError("group offsets need ZooKeeper; this cluster has only static brokers")
                try:
                    self._zk = connect_zookeeper(self.zookeeper, self.timeout, self.timeout)
                except ZooKeeperUnavailable as exc:
                    raise ConnectionError(str(exc)) from None
            return self._zk

    def connection(self, host: str, port: int) -> BrokerConnection:
        with self._lock:
            conn = self._connections.get((host, port))
            if conn is None:
                conn = BrokerConnection(host, port, self.client_id, self.timeout)
                self._connections[(host, port)] = conn
            return conn

    def close(self) -> None:
        with self._lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()
            if self._zk is not None:
                try:
                    self._zk.stop()
                    self._zk.close()
                finally:
                    self._zk = None

    def __enter__(self) -> "LogbusCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ metadata

    def brokers(self) -> dict[int, BrokerInfo]:
        if self.zookeeper:
            from kazoo.exceptions import NoNodeError

            try:
                return read_brokers(self.zk)
            except NoNodeError:
                return {}
        return {b.broker_id: b for b in self._metadata().brokers}

    def _metadata(self, topics: list[str] | None = None):
        errors = []
        for host, port in self.static_brokers:
            conn = self.connection(host, port)
            try:
                return conn.metadata(topics)
            except (ConnectionError, LogbusError) as exc:
                conn.close()
                errors.append(f"{host}:{port}: {exc}")
        raise ConnectionError("no static broker answered METADATA: " + "; ".join(errors))

    def topics(self) -> list[str]:
        if self.zookeeper:
            from kazoo.exceptions import NoNodeError

            try:
                return sorted(self.zk.get_children(BROKER_TOPICS))
            except NoNodeError:
                return []
        return sorted(t.topic for t in self._metadata().topics)

    def leaders(self, topic: str) -> dict[int, int]:
        """partition -> leader broker id (first replica), for every partition of `topic`."""
        if self.zookeeper:
            from kazoo.exceptions import NoNodeError

            try:
                data, _ = self.zk.get(topic_path(topic))
            except NoNodeError:
                raise UnknownTopic(f"topic {topic!r} does not exist (no {topic_path(topic)} in ZooKeeper)") from None
            return {p: replicas[0] for p, replicas in sorted(decode_assignment(data).items())}
        for t in self._metadata([topic]).topics:
            if t.topic == topic and t.error_code == 0:
                return {p.partition: p.leader for p in sorted(t.partitions, key=lambda p: p.partition)}
        raise UnknownTopic(f"topic {topic!r} does not exist")

    def partitions(self, topic: str) -> list[int]:
        return sorted(self.leaders(topic))

    def leader_connection(self, topic: str, partition: int) -> BrokerConnection:
        leaders = self.leaders(topic)
        if partition not in leaders:
            raise UnknownTopic(f"topic {topic!r} has no partition {partition} (it has {sorted(leaders)})")
        broker = self.brokers().get(leaders[partition])
        if broker is None:
            raise ConnectionError(
                f"leader broker {leaders[partition]} of {topic}-{partition} is not live; "
                "the partition is unavailable until it returns"
            )
        return self.connection(broker.host, broker.port)

    def _call_leader(self, topic: str, partition: int, fn):
        """Run `fn(connection)` at the partition's leader, once more after a leader change
        or a dropped connection."""
        for attempt in range(3):
            conn = self.leader_connection(topic, partition)
            try:
                return fn(conn)
            except (ConnectionError, NotLeaderForPartition):
                conn.close()
                if attempt == 2:
                    raise
                time.sleep(0.2 * (attempt + 1))

    # ------------------------------------------------------------------ offsets

    def offsets_before(self, topic: str, partition: int, time_ms: int, max_offsets: int = 1) -> list[int]:
        return self._call_leader(topic, partition, lambda c: c.offsets(topic, partition, time_ms, max_offsets))

    def earliest(self, topic: str, partition: int) -> int:
        return self.offsets_before(topic, partition, EARLIEST)[0]

    def latest(self, topic: str, partition: int) -> int:
        return self.offsets_before(topic, partition, LATEST)[0]

    def partition_offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        leaders = self.leaders(topic)
        return {
            p: PartitionOffsets(topic, p, leader, self.earliest(topic, p), self.latest(topic, p))
            for p, leader in leaders.items()
        }

    def group_offsets(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed next offsets in ZooKeeper; partitions without one are absent."""
        from kazoo.exceptions import NoNodeError

        out = {}
        for p in self.partitions(topic):
            try:
                data, _ = self.zk.get(offset_path(group, topic, p))
                out[p] = int(data.decode().strip())
            except (NoNodeError, ValueError):
                continue
        return out

    def set_group_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Write next offsets for the group, only ever forwards (a mirror never goes back).
        Concurrent writers are expected (overlapping runs commit one after another): a
        version conflict re-reads the node and tries again until the stored offset is at
        or past ours."""
        for p, offset in offsets.items():
            self._advance_offset(offset_path(group, topic, int(p)), int(offset))

    def _advance_offset(self, path: str, offset: int, attempts: int = 20) -> None:
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

        for _ in range(attempts):
            try:
                data, stat = self.zk.get(path)
            except NoNodeError:
                try:
                    self.zk.create(path, str(offset).encode(), makepath=True)
                    return
                except NodeExistsError:
                    continue
            try:
                current = int(data.decode().strip() or -1)
            except ValueError:
                current = -1
            if current >= offset:
                return
            try:
                self.zk.set(path, str(offset).encode(), version=stat.version)
                return
            except BadVersionError:
                logger.info("group offset %s changed while advancing it to %d; reading it again", path, offset)
        logger.warning("gave up advancing group offset %s to %d after %d concurrent updates (lag monitoring only)",
                    path, offset, attempts)

    def lag(self, group: str, topic: str, missing: str = "earliest") -> dict[int, int]:
        """Bytes between the group's offset and the end, per partition. A partition the
        group never committed counts from `missing` ('earliest' or 'latest')."""
        committed = self.group_offsets(group, topic)
        lag = {}
        for p, offsets in self.partition_offsets(topic).items():
            start = committed.get(p, offsets.earliest if missing == "earliest" else offsets.latest)
            lag[p] = max(offsets.latest - max(start, offsets.earliest), 0)
        return lag

    def has_data_after(self, topic: str, partition: int, time_ms: int) -> bool:
        """Whether the partition holds a flushed message with a timestamp > `time_ms`,
        from one OFFSETS(time) lookup: the broker answers the end offset when all data is
        at or before `time_ms`, and segment starts otherwise (DESIGN §3)."""
        answer = self.offsets_before(topic, partition, time_ms, 1)
        latest = self.latest(topic, partition)
        if not answer:
            return latest > self.earliest(topic, partition)  # every segment starts after time_ms
        return answer[0] != latest

    def segment_starts(self, topic: str, partition: int, max_offsets: int = 10_000) -> list[int]:
        """Start offsets of the partition's segments (message boundaries), ascending."""
        starts = self.offsets_before(topic, partition, 1 << 62, max_offsets)
        latest = self.latest(topic, partition)
        return sorted(o for o in starts if o != latest)

    # ------------------------------------------------------------------ reading

    def boundary_at_or_before(self, topic: str, partition: int, start: int, limit: int) -> int:
        """The last message boundary in (start, start+limit] (at least one whole message):
        lets a per-run byte cap end a range between messages."""
        fetch = self._call_leader(topic, partition, lambda c: c.fetch(topic, partition, start, limit))
        result = scan(fetch.messages)
        if result.valid_bytes:
            return start + result.valid_bytes
        buf = fetch.messages
        if len(buf) >= SIZE_FIELD:  # the first message alone is bigger than the cap
            (size,) = struct.unpack_from(">i", buf, 0)
            return start + SIZE_FIELD + size
        return start

    def read_range(self, topic: str, partition: int, start: int, end: int,
                   fetch_bytes: int = DEFAULT_FETCH_BYTES) -> Iterator[tuple[int, bytes]]:
        """Whole message sets covering [start, end): yields (base_offset, buffer) with
        complete entries only; stops exactly at `end` (a message boundary)."""
        offset = start
        while offset < end:
            want = min(fetch_bytes, end - offset)
            fetched = self._call_leader(topic, partition, lambda c: c.fetch(topic, partition, offset, want))
            buf = fetched.messages
            result_end = _complete_prefix(buf)
            if result_end == 0:
                if len(buf) >= SIZE_FIELD:
                    (size,) = struct.unpack_from(">i", buf, 0)
                    if offset + SIZE_FIELD + size > end:  # growing the fetch cannot help
                        raise LogbusError(
                            f"{topic}-{partition}: range end {end} is not a message boundary: the message at "
                            f"{offset} ends at {offset + SIZE_FIELD + size}"
                        )
                    fetch_bytes = max(fetch_bytes, size + SIZE_FIELD)  # one message larger than the fetch
                    continue
                raise LogbusError(
                    f"{topic}-{partition}: no data at offset {offset} though the range ends at {end} "
                    f"(high watermark {fetched.high_watermark})"
                )
            yield offset, bytes(buf[:result_end]) if result_end < len(buf) else bytes(buf)
            offset += result_end


def _complete_prefix(buf) -> int:
    """Bytes of `buf` made of whole entries (sizes only; CRCs are checked by the decoder)."""
    pos, end = 0, len(buf)
    unpack = HEADER.unpack_from
    while end - pos >= HEADER.size:
        size = unpack(buf, pos)[0]
        if pos + SIZE_FIELD + size > end:
            break
        pos += SIZE_FIELD + size
    return pos


def dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True)
