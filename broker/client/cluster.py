"""Calls at partition leaders: `ConnectionPool` keeps one `BrokerConnection` per broker
id and runs calls at a partition's leader (`call_leader`), following leader changes
and, with `leader_wait`, waiting a bounded time for a partition without a reachable
leader; `ensure_topic` creates a topic as a first produce would. Where the leaders are
comes from `broker.client.metadata`. Nothing here sends data; producers, consumers,
offsets (`broker.client.offsets`) and range reads (`broker.client.ranges`) build on it.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Callable, TypeVar

from broker.client.connection import BrokerConnection
from broker.client.errors import NoBrokersAvailable
from broker.client.metadata import ClusterMetadata, Leaders
from broker.common.errors import (
    FencedLeaderEpoch, NotLeaderForPartition, PartitionOffline, UnknownPartition, UnknownTopic,
)
from broker.common.protocol import AUTO_PARTITIONS

logger = logging.getLogger(__name__)

# Answers that mean "ask again after refreshing the leaders": the leader moved, the
# partition has none right now (the controller is electing one), or our view of its
# leader epoch is stale. Retried by every client, by class (= by wire error code).
LEADER_MOVED = (NotLeaderForPartition, PartitionOffline, FencedLeaderEpoch)
LEADER_WAIT_POLL_S = 0.5  # a call waiting for a leader (`leader_wait`) looks again this often
T = TypeVar("T")


class ConnectionPool:
    """One connection per broker id, opened on first use, replaced when the broker's
    address changes. Not thread-safe: each thread that talks to brokers owns a pool.

    `leader_wait` (seconds, default 0) is how long `call_leader` waits for a partition
    that has no reachable leader — its only replica's broker restarting, or the
    controller still electing a new leader — before it fails. 0 fails at once, which
    suits callers that poll anyway; a batch read that would otherwise fail a whole job
    (the provider's load) rides out a short outage with it."""

    def __init__(self, metadata: ClusterMetadata, client_id: str, timeout: float, leader_wait: float = 0.0) -> None:
        if leader_wait < 0:
            raise ValueError(f"leader_wait must be >= 0 seconds, not {leader_wait!r}")
        self.metadata = metadata
        self.client_id = client_id
        self.timeout = timeout
        self.leader_wait = leader_wait
        self._connections: dict[int, BrokerConnection] = {}

    def get(self, broker_id: int) -> BrokerConnection:
        info = self.metadata.brokers().get(broker_id)
        if info is None:
            raise ConnectionError(f"broker {broker_id} is not live")
        security = self.metadata.security
        if security.listener is not None and info.endpoints:
            info = info.at(security.listener)
        conn = self._connections.get(broker_id)
        if conn is not None and (conn.host, conn.port) != (info.host, info.port):
            conn.close()
            conn = None
        if conn is None:
            conn = BrokerConnection(info.host, info.port, self.client_id, self.timeout, security)
            self._connections[broker_id] = conn
        return conn.connect()

    def any(self) -> BrokerConnection:
        """A connection to some live broker, for requests any broker can answer."""
        ids = list(self.metadata.brokers())
        random.shuffle(ids)
        errors = []
        for broker_id in ids:
            try:
                return self.get(broker_id)
            except ConnectionError as exc:
                errors.append(str(exc))
        raise NoBrokersAvailable("no live broker reachable" + (": " + "; ".join(errors) if errors else ""))

    def leader(self, topic: str, partition: int) -> BrokerConnection:
        """A connection to the partition's leader; ConnectionError naming the leader
        broker while it is down."""
        leaders = self.metadata.partitions(topic)
        if leaders is None:
            raise UnknownTopic(f"unknown topic {topic!r}")
        if partition not in leaders:
            raise UnknownPartition(f"topic {topic!r} has no partition {partition}")
        leader = leaders[partition]
        if leader < 0:
            replicas = (self.metadata.assignment(topic) or {}).get(partition)
            if not replicas:
                raise ConnectionError(f"partition {topic}-{partition} has no live leader")
            if len(replicas) > 1:
                raise ConnectionError(f"partition {topic}-{partition} has no live leader (replicas {replicas}): it is "
                                      "offline, or the controller is moving its leadership")
            raise ConnectionError(f"leader broker {replicas[0]} of {topic}-{partition} is not live; "
                                  "the partition is unavailable until it returns")
        return self.get(leader)

    def call_leader(self, topic: str, partition: int, call: Callable[[BrokerConnection], T],
                    attempts: int = 3, backoff: float = 0.2) -> T:
        """`call(connection)` at the partition's leader. After a lost connection or a
        leader change (`LEADER_MOVED`) the metadata is refreshed and the call made
        again, up to `attempts` times. A partition left without a reachable leader (its
        leader down, or the retries spent) fails at once with a `ConnectionError`
        naming the partition, or is waited for up to `leader_wait` seconds first."""
        attempt, deadline = 1, None
        while True:
            try:
                conn = self.leader(topic, partition)
            except ConnectionError as exc:
                deadline = self._wait_for_leader(topic, partition, exc, deadline)
                continue
            try:
                result = call(conn)
            except (ConnectionError, *LEADER_MOVED) as exc:
                self.drop_connection(conn)
                if attempt >= attempts:
                    deadline = self._wait_for_leader(topic, partition, exc, deadline)
                    continue
                logger.info("%s-%d: %s; refreshing metadata and trying again", topic, partition, exc)
                time.sleep(backoff * attempt)
                self.metadata.refresh(topic)
                attempt += 1
                continue
            if deadline is not None:
                logger.warning("%s-%d has a reachable leader again; going on", topic, partition)
            return result

    def _wait_for_leader(self, topic: str, partition: int, cause: Exception, deadline: float | None) -> float:
        """One step of waiting for a leader of `topic`-`partition`: re-raise `cause`
        when there is no `leader_wait`, say once which partition is waited for and
        why, fail naming it once the wait is over; else pause and refresh the
        metadata. Returns the wait's deadline (monotonic)."""
        now = time.monotonic()
        if deadline is None:
            if self.leader_wait <= 0:
                raise cause
            deadline = now + self.leader_wait
            logger.warning("%s; waiting up to %gs for a leader of %s-%d (leader_wait)", cause, self.leader_wait,
                           topic, partition)
        elif now >= deadline:
            raise ConnectionError(f"no leader of {topic}-{partition} reachable within leader_wait "
                                  f"{self.leader_wait:g}s: {cause}") from cause
        time.sleep(min(LEADER_WAIT_POLL_S, max(deadline - now, 0.0)))
        self.metadata.refresh(topic)
        return deadline

    def drop(self, broker_id: int) -> None:
        conn = self._connections.pop(broker_id, None)
        if conn is not None:
            conn.close()

    def drop_connection(self, conn: BrokerConnection) -> None:
        for broker_id, known in list(self._connections.items()):
            if known is conn:
                self.drop(broker_id)

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()


def ensure_topic(metadata: ClusterMetadata, pool: ConnectionPool, topic: str, timeout: float = 10.0) -> Leaders:
    """The topic's leaders, auto-creating the topic on a broker if it does not exist.

    CREATE_TOPIC with `AUTO_PARTITIONS` creates it as a first produce would, with the
    broker's `num.partitions`, which the client does not know. Raises UnknownTopic
    when auto-creation is off.
    """
    leaders = metadata.partitions(topic)
    if leaders is not None:
        return leaders
    conn = pool.any()
    try:
        conn.create_topic(topic, AUTO_PARTITIONS)  # as a first produce would; refused if auto-create is off
    except ConnectionError:
        pool.drop_connection(conn)
        raise
    deadline = time.monotonic() + timeout
    while True:
        metadata.refresh(topic)
        leaders = metadata.partitions(topic)
        if leaders is not None:
            return leaders
        if time.monotonic() > deadline:
            raise UnknownTopic(f"topic {topic!r} did not appear within {timeout:g}s of its creation")
        time.sleep(0.05)
