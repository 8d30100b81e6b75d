"""Where partitions live: the client's view of brokers and partition leaders.

Two sources give the same answers (docs/zookeeper.md, docs/clients.md):

- `ZooKeeperMetadata` reads `/brokers/ids` and `/brokers/topics/<t>` and keeps them
  current with kazoo watches, so a leader change or a broker death is seen without
  polling;
- `BrokerListMetadata` asks a static list of brokers with METADATA, on demand.

Both answer `partitions(topic)` as {partition: leader broker id, -1 while the partition
is offline or its leader is down} — leaders as the controller wrote them in the
partition state nodes (`broker.common.partitionstates`; METADATA version 1 from a broker
list) — and `assignment(topic)` as {partition: replica broker ids, preferred leader
first}. Each carries the `ClientSecurity` its brokers are reached with. Calls at the
leaders go through `broker.client.cluster.ConnectionPool`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Callable, Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from broker.client.connection import BrokerConnection
from broker.client.errors import ZooKeeperUnavailable
from broker.client.security import OPEN, ClientSecurity
from broker.common.errors import AuthenticationError, AuthorizationFailed, ErrorCode, LogbusError
from broker.common.partitionstates import PartitionStates, live_leader
from broker.common.protocol import BrokerInfo
from broker.common.zkauth import NO_AUTH, ZooKeeperAuth
from broker.common.zklayout import (
    BROKER_IDS, BROKER_TOPICS, Assignment, decode_assignment, read_assignment, read_brokers, topic_path,
)
from broker.common.zksession import start_session

logger = logging.getLogger(__name__)

Leaders = dict[int, int]  # partition -> leader broker id (-1: unavailable)
LEADERLESS_REFRESH_S = 0.5  # a broker-list client re-asks this often while a partition has no leader


def connect_zookeeper(connect: str, timeout: float = 10.0, session_timeout: float = 10.0,
                      auth: ZooKeeperAuth = NO_AUTH) -> KazooClient:
    """A started kazoo client, or `ZooKeeperUnavailable` after `timeout` seconds; with
    `auth`, authenticated and creating nodes with its ACL (docs/zookeeper.md)."""
    zk = KazooClient(hosts=connect, timeout=session_timeout, **auth.client_kwargs())
    try:
        start_session(zk, timeout)
    except (KazooTimeoutError, Exception) as exc:  # kazoo raises several kinds on bad hosts
        try:
            zk.stop()
            zk.close()
        except Exception:
            pass
        raise ZooKeeperUnavailable(f"cannot connect to ZooKeeper at {connect!r} within {timeout:g}s: {exc}") from None
    return zk


def parse_broker_list(brokers: list[str] | str) -> list[tuple[str, int]]:
    """"host:port" strings (or one comma-separated string) as (host, port) pairs."""
    if isinstance(brokers, str):
        brokers = [b for b in brokers.split(",") if b.strip()]
    out = []
    for item in brokers:
        host, sep, port = item.strip().rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"broker address {item!r} is not host:port")
        out.append((host or "127.0.0.1", int(port)))
    if not out:
        raise ValueError("the broker list is empty")
    return out


class ClusterMetadata(Protocol):
    security: ClientSecurity  # how this cluster's brokers are reached (listener, TLS, SASL)

    def brokers(self) -> dict[int, BrokerInfo]: ...

    def partitions(self, topic: str) -> Leaders | None: ...

    def assignment(self, topic: str) -> Assignment | None: ...

    def refresh(self, topic: str | None = None) -> None: ...

    def topics(self) -> list[str]: ...

    def add_listener(self, listener: Callable[[], None]) -> None: ...

    def close(self) -> None: ...


def available(leaders: Leaders) -> list[int]:
    """Partitions whose leader is live, sorted."""
    return sorted(p for p, leader in leaders.items() if leader >= 0)


class ZooKeeperMetadata:
    """Brokers and assignments from ZooKeeper, kept current by watches.

    `_brokers` and `_assignments` are replaced whole (never mutated), so readers need
    no lock; `_lock` guards starting a watch on a topic only once.
    """

    def __init__(self, zk: KazooClient, owns_client: bool = False, security: ClientSecurity = OPEN) -> None:
        self.zk = zk
        self.owns_client = owns_client
        self.security = security
        self._brokers: dict[int, BrokerInfo] = {}
        self._assignments: dict[str, Assignment] = {}
        self._watched: set[str] = set()
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._closed = False
        self._states = PartitionStates(zk)  # leaders by the controller; no listener: a leader move is no rebalance
        zk.ensure_path(BROKER_IDS)
        zk.ensure_path(BROKER_TOPICS)
        ChildrenWatch(zk, BROKER_IDS, self._on_brokers)

    @classmethod
    def connect(cls, connect: str, timeout: float = 10.0, security: ClientSecurity = OPEN) -> "ZooKeeperMetadata":
        return cls(connect_zookeeper(connect, timeout, auth=security.zookeeper()), owns_client=True, security=security)

    def _on_brokers(self, children: list[str]) -> bool | None:
        if self._closed:
            return False
        brokers = read_brokers(self.zk, children)
        self._brokers = brokers
        logger.debug("live brokers: %s", sorted(brokers))
        self._notify()
        return None

    def _watch_topic(self, topic: str) -> bool:
        """Start watching `topic`; True if this call started the watch."""
        with self._lock:
            if topic in self._watched:
                return False
            self._watched.add(topic)
        DataWatch(self.zk, topic_path(topic), self._topic_watcher(topic))
        return True

    def _topic_watcher(self, topic: str) -> Callable[[bytes | None, object], bool | None]:
        """A two-argument callback: kazoo passes a third (the event) to any function
        that accepts one, which would overwrite a `topic=topic` default."""

        def watch(data: bytes | None, stat: object) -> bool | None:
            return self._on_topic(topic, data)

        return watch

    def _on_topic(self, topic: str, data: bytes | None) -> bool | None:
        if self._closed:
            return False
        assignments = dict(self._assignments)
        if data is None:
            assignments.pop(topic, None)
        else:
            try:
                assignments[topic] = decode_assignment(data)
            except (ValueError, KeyError, TypeError):
                logger.error("ignoring unreadable assignment of topic %s", topic)
                return None
            self._states.watch(topic, assignments[topic])
        self._assignments = assignments
        self._notify()
        return None

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                logger.exception("metadata listener failed")

    def add_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` runs in kazoo's thread after every broker or watched-topic change."""
        self._listeners.append(listener)

    def brokers(self) -> dict[int, BrokerInfo]:
        return self._brokers

    def assignment(self, topic: str) -> Assignment | None:
        if self._watch_topic(topic) and topic not in self._assignments:
            # the watch's first callback may come later, from kazoo's thread: without this
            # read a first-time caller is told the topic does not exist
            self.refresh(topic)
        return self._assignments.get(topic)

    def partitions(self, topic: str) -> Leaders | None:
        assignment = self.assignment(topic)
        if assignment is None:
            return None
        brokers = self._brokers
        return {p: live_leader(self._states.get(topic, p, r), brokers) for p, r in assignment.items()}

    def refresh(self, topic: str | None = None) -> None:
        """Re-read from ZooKeeper (watches keep us current; this closes the gap between
        an event and its watch firing, e.g. right after a topic was auto-created)."""
        try:
            self._brokers = read_brokers(self.zk)
            if topic is not None:
                self._watch_topic(topic)
                assignment = read_assignment(self.zk, topic)
                if assignment is not None:
                    self._assignments = {**self._assignments, topic: assignment}
                    self._states.reread(topic, assignment)
                else:  # deleted meanwhile
                    self._assignments = {t: a for t, a in self._assignments.items() if t != topic}
        except Exception as exc:  # ZooKeeper down: keep the last view, say why
            logger.warning("cannot refresh metadata from ZooKeeper: %s", exc)

    def topics(self) -> list[str]:
        try:
            return sorted(self.zk.get_children(BROKER_TOPICS))
        except NoNodeError:
            return []

    def close(self) -> None:
        self._closed = True
        self._states.close()
        if self.owns_client:
            try:
                self.zk.stop()
                self.zk.close()
            except Exception:
                pass


class BrokerListMetadata:
    """Metadata from METADATA requests to a static broker list (no ZooKeeper).

    `_view` is replaced whole; `_lock` serializes refreshes (one socket at a time).
    """

    def __init__(self, brokers: list[str] | str, client_id: str = "logbus-python", timeout: float = 10.0,
                 min_refresh_interval: float = 0.1, security: ClientSecurity = OPEN) -> None:
        self.seeds = parse_broker_list(brokers)
        self.security = security  # the seeds are addresses of the listener to use: brokers answer with theirs
        self.client_id = client_id
        self.timeout = timeout
        self.min_refresh_interval = min_refresh_interval
        self._brokers: dict[int, BrokerInfo] = {}
        self._leaders: dict[str, Leaders] = {}
        self._assignments: dict[str, Assignment] = {}
        self._lock = threading.Lock()
        self._last_refresh = 0.0
        self._listeners: list[Callable[[], None]] = []

    def _addresses(self) -> list[tuple[str, int]]:
        known = [(b.host, b.port) for b in self._brokers.values()]
        seeds = list(self.seeds)
        random.shuffle(seeds)
        return seeds + [a for a in known if a not in seeds]

    def refresh(self, topic: str | None = None) -> None:
        with self._lock:
            if time.monotonic() - self._last_refresh < self.min_refresh_interval:
                return
            errors = []
            for host, port in self._addresses():
                try:
                    with BrokerConnection(host, port, self.client_id, self.timeout, self.security) as conn:
                        response = conn.metadata([])
                except (ConnectionError, LogbusError, OSError) as exc:
                    if isinstance(exc, (AuthenticationError, AuthorizationFailed)):
                        raise  # every broker would say the same: say it now
                    errors.append(str(exc))
                    continue
                self._brokers = {b.broker_id: b for b in response.brokers}
                known = [t for t in response.topics if t.error_code == ErrorCode.NONE]
                self._leaders = {t.topic: {p.partition: p.leader for p in t.partitions} for t in known}
                self._assignments = {t.topic: {p.partition: list(p.replicas) for p in t.partitions} for t in known}
                self._last_refresh = time.monotonic()
                break
            else:
                self._brokers = {}
                self._leaders = {t: {p: -1 for p in leaders} for t, leaders in self._leaders.items()}
                self._last_refresh = time.monotonic()
                logger.warning("no broker answered METADATA: %s", "; ".join(errors))
        for listener in list(self._listeners):
            listener()

    def brokers(self) -> dict[int, BrokerInfo]:
        if not self._last_refresh:
            self.refresh()
        return self._brokers

    def partitions(self, topic: str) -> Leaders | None:
        """Leaders as last asked; asked again (at most every LEADERLESS_REFRESH_S) while
        a partition has none: nothing else tells a broker-list client that the
        controller elected one, and a producer waiting for a leader sends nothing that
        could fail and trigger a refresh."""
        leaders = self._leaders.get(topic)
        if leaders is None or (-1 in leaders.values()
                               and time.monotonic() - self._last_refresh >= LEADERLESS_REFRESH_S):
            self.refresh(topic)
        return self._leaders.get(topic)

    def assignment(self, topic: str) -> Assignment | None:
        if topic not in self._assignments:
            self.refresh(topic)
        return self._assignments.get(topic)

    def topics(self) -> list[str]:
        self.refresh()
        return sorted(self._leaders)

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def close(self) -> None:
        pass


def open_metadata(zookeeper: str | None = None, brokers: list[str] | str | None = None,
                  client_id: str = "logbus-python", timeout: float = 10.0,
                  security: ClientSecurity = OPEN) -> ClusterMetadata:
    """Metadata from ZooKeeper or from a static broker list; exactly one must be given."""
    if (zookeeper is None) == (brokers is None):
        raise ValueError("give exactly one of zookeeper= (connect string) or brokers= (host:port list)")
    if zookeeper is not None:
        return ZooKeeperMetadata.connect(zookeeper, timeout, security)
    return BrokerListMetadata(brokers, client_id, timeout, security=security)
