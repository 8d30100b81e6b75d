"""The provider's handle on a logbus cluster (plain Python: no Airflow, no Spark).

`LogbusCluster` is a thin facade over the client library: one watched metadata view
(`broker.client.metadata`) and one connection pool (`broker.client.cluster`), offsets (`broker.client.offsets`),
exact byte-range reads (`broker.client.ranges`), group offsets in ZooKeeper
(`broker.common.zklayout`), monitoring events (`broker.client.monitoring`) and the brokers' record
counts (`broker.client.brokercounts`). The hook wraps it for Airflow; the Spark data source uses it on
executors, where Airflow is not importable.
"""

from __future__ import annotations

from typing import Iterator

from broker.client import monitoring, offsets, ranges
from broker.client.brokercounts import BrokerCounts, read_broker_counts
from broker.client.cluster import ConnectionPool
from broker.client.metadata import ClusterMetadata, ZooKeeperMetadata, open_metadata, parse_broker_list
from broker.client.errors import ZooKeeperUnavailable
from broker.client.offsets import PartitionOffsets
from broker.client.ranges import DEFAULT_FETCH_BYTES
from broker.client.security import OPEN, ClientSecurity
from broker.common.protocol import BrokerInfo

__all__ = ["ClusterConfigError", "LOAD_LEADER_WAIT_S", "LogbusCluster", "PartitionOffsets", "leader_wait_seconds"]


class ClusterConfigError(ValueError):
    """The cluster address or a setting is missing or malformed."""


def parse_brokers(brokers: str | list) -> list[str]:
    """'h1:9092,h2:9093', ['h1:9092'] or [('h1', 9092)] -> ['h1:9092', ...] (checked by
    the clients' parser, its errors as ClusterConfigError)."""
    if not isinstance(brokers, str):
        brokers = [f"{b[0]}:{b[1]}" if isinstance(b, (tuple, list)) else str(b) for b in brokers]
    try:
        return [f"{host}:{port}" for host, port in parse_broker_list(brokers)]
    except ValueError as exc:
        raise ClusterConfigError(str(exc)) from None


# A secured cluster's client properties (JSON, `broker.client.security`) on their way to
# a load's Spark job: the operator puts them in spark-submit's environment, never on
# its command line; the driver hands them to the executors as the data source's
# `security` option, inside the job, not in any log.
SECURITY_ENV = "LOGBUS_CLIENT_SECURITY"

# How long a load's reads wait for a partition without a reachable leader (a broker
# restarting, the controller moving a leadership) before the load fails: a load that
# failed at once spent a task retry, and Spark's start-up, on each such outage.
LOAD_LEADER_WAIT_S = 60.0


def leader_wait_seconds(value: object) -> float:
    """A `leader_wait` setting (a number, or its text from a template or an option) as
    seconds; `ClusterConfigError` naming the value unless it is a finite number >= 0."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ClusterConfigError(f"leader_wait must be a number of seconds, not {value!r}") from None
    if not 0 <= seconds < float("inf"):
        raise ClusterConfigError(f"leader_wait must be a finite number of seconds >= 0, not {value!r}")
    return seconds


class LogbusCluster:
    """A cluster seen through ZooKeeper (`zookeeper="h:p/chroot"`) or a static list of
    brokers (`brokers="h:p,h:p"`, answered with METADATA). Metadata is opened on first
    use and then kept current by watches; connections are cached; `close()` releases
    both. Like the connection pool it holds, one per thread.

    `leader_wait`: seconds a call at a partition's leader waits for a partition without
    a reachable leader before it fails (`ConnectionPool`); 0, the default, fails at once
    — the hook's callers (snapshot, sensor, commit) are retried by Airflow or poll, and
    the load's data source passes `LOAD_LEADER_WAIT_S` or the operator's setting."""

    def __init__(self, zookeeper: str | None = None, brokers: str | list | None = None,
                 timeout: float = 15.0, client_id: str = "logbus-airflow", leader_wait: float = 0.0,
                 security: ClientSecurity = OPEN) -> None:
        if not zookeeper and not brokers:
            raise ClusterConfigError("give a ZooKeeper connect string or a list of brokers")
        self.zookeeper = zookeeper or None
        self.static_brokers = None if self.zookeeper else parse_brokers(brokers)
        self.timeout = timeout
        self.client_id = client_id
        self.leader_wait = leader_wait_seconds(leader_wait)
        self.security = security  # listener, TLS, SASL (docs/provider.md, "A secured cluster")
        self._pool: ConnectionPool | None = None

    @property
    def pool(self) -> ConnectionPool:
        """The connection pool over the cluster's metadata, opened on first use."""
        if self._pool is None:
            try:
                metadata = open_metadata(self.zookeeper, self.static_brokers, self.client_id, self.timeout,
                                         self.security)
            except ZooKeeperUnavailable as exc:
                raise ConnectionError(str(exc)) from None
            self._pool = ConnectionPool(metadata, self.client_id, self.timeout, self.leader_wait)
        return self._pool

    @property
    def metadata(self) -> ClusterMetadata:
        return self.pool.metadata

    def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()
            pool.metadata.close()

    def __enter__(self) -> "LogbusCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ monitoring

    def monitoring_events(self, monitoring_topic: str = monitoring.MONITORING_TOPIC,
                          since_ms: int | None = None) -> list[dict]:
        """Every monitoring event in the cluster, of every tier, read on this handle's
        metadata (with `since_ms`: from the segment holding that time on)."""
        return monitoring.read_events(monitoring_topic=monitoring_topic, metadata=self.metadata, since_ms=since_ms)

    def broker_counts(self) -> BrokerCounts:
        """The brokers' record counts of every topic (`broker.client.brokercounts`; none
        without ZooKeeper: a cluster given as a list of brokers)."""
        metadata = self.metadata
        return read_broker_counts(metadata.zk) if isinstance(metadata, ZooKeeperMetadata) else BrokerCounts()

    # ------------------------------------------------------------------ metadata

    def brokers(self) -> dict[int, BrokerInfo]:
        return self.metadata.brokers()

    def topics(self) -> list[str]:
        return self.metadata.topics()

    def leaders(self, topic: str) -> dict[int, int]:
        """partition -> assigned leader broker id (first replica), for every partition of `topic`."""
        return offsets.assigned_leaders(self.pool, topic)

    def partitions(self, topic: str) -> list[int]:
        return sorted(self.leaders(topic))

    # ------------------------------------------------------------------ offsets

    def offsets_before(self, topic: str, partition: int, time_ms: int, max_offsets: int = 1) -> list[int]:
        return offsets.offsets_before(self.pool, topic, partition, time_ms, max_offsets)

    def earliest(self, topic: str, partition: int) -> int:
        return offsets.earliest(self.pool, topic, partition)

    def latest(self, topic: str, partition: int) -> int:
        return offsets.latest(self.pool, topic, partition)

    def partition_offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        return offsets.partition_offsets(self.pool, topic)

    def has_data_after(self, topic: str, partition: int, time_ms: int) -> bool:
        return offsets.has_data_after(self.pool, topic, partition, time_ms)

    def segment_starts(self, topic: str, partition: int, max_offsets: int = 10_000) -> list[int]:
        return offsets.segment_starts(self.pool, topic, partition, max_offsets)

    def _zookeeper(self):
        metadata = self.metadata
        if not isinstance(metadata, ZooKeeperMetadata):
            raise ClusterConfigError("group offsets need ZooKeeper; this cluster has only static brokers")
        return metadata.zk

    def group_offsets(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed next offsets in ZooKeeper; partitions without one are absent."""
        return offsets.group_offsets(self._zookeeper(), group, topic, self.partitions(topic))

    def set_group_offsets(self, group: str, topic: str, next_offsets: dict[int, int]) -> None:
        """Advance the group's next offsets, never back (compare-and-set in ZooKeeper)."""
        offsets.advance_group_offsets(self._zookeeper(), group, topic, next_offsets)

    def lag(self, group: str, topic: str, missing: str = "earliest") -> dict[int, int]:
        """Records between the group's offset and the end, per partition (`offsets.lag`)."""
        return self.lag_behind(topic, self.group_offsets(group, topic), missing=missing)

    def lag_behind(self, topic: str, next_offsets: dict[int, int], partition_offsets: dict | None = None,
                   missing: str = "earliest") -> dict[int, int]:
        """Records from `next_offsets` (a group's, a table's committed ends) to each
        partition's end, counted by its leader (`offsets.records_lag`); the ends are
        `partition_offsets` when given, so a caller that shows them shows the same."""
        partition_offsets = partition_offsets if partition_offsets is not None else self.partition_offsets(topic)
        return offsets.records_lag(self.pool, topic, partition_offsets, next_offsets, missing)

    # ------------------------------------------------------------------ reading

    def boundary_at_or_before(self, topic: str, partition: int, start: int, limit: int) -> int:
        return ranges.boundary_at_or_before(self.pool, topic, partition, start, limit)

    def read_range(self, topic: str, partition: int, start: int, end: int,
                   fetch_bytes: int = DEFAULT_FETCH_BYTES) -> Iterator[tuple[int, bytes]]:
        """Whole message sets covering [start, end) (`broker.client.ranges.read_range`)."""
        return ranges.read_range(self.pool, topic, partition, start, end, fetch_bytes)
