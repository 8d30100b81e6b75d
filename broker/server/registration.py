"""The broker's own registration in ZooKeeper (docs/zookeeper.md), on the shared layout
(`broker.common.zklayout`).

`BrokerRegistry` creates the broker's ephemeral node, creates it again after a session
expiry, writes topic assignments (CREATE_TOPIC, auto-create) and keeps an in-memory
`ClusterView` (live brokers, topic assignments and ids) fed by kazoo watches; request
handlers read it without locks because it is replaced whole. A topic whose node goes,
or comes back with another topic id (deleted and created again), is reported to
`on_removed` before anything of the new one. Broker-side only: clients never
import this module.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import ConnectionLoss, NodeExistsError, NoNodeError, SessionExpiredError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from broker import __version__
from broker.common.errors import TopicAlreadyExists, UnknownError, UnknownTopic
from broker.common.partitionstates import PartitionStates
from broker.common.protocol import BrokerInfo
from broker.common.zklayout import (
    BROKER_IDS, BROKER_TOPICS, CONSUMERS, DELETE_TOPICS, Assignment, broker_path, create_topic, decode_assignment,
    decode_topic_id, encode_broker, read_brokers, topic_path,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterView:
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, Assignment] = field(default_factory=dict)
    topic_ids: dict[str, str | None] = field(default_factory=dict)  # None: a topic from before ids

    def without(self, topic: str) -> "ClusterView":
        return ClusterView(self.brokers, {t: a for t, a in self.topics.items() if t != topic},
                           {t: i for t, i in self.topic_ids.items() if t != topic})


class BrokerRegistry:
    """Registers this broker, keeps the registration across session expiries, and
    watches brokers and topic assignments. `on_assignment(topic, assignment)` runs in
    kazoo's thread for every topic seen or changed, `on_removed(topic)` for every
    topic deleted (or replaced by a new incarnation)."""

    def __init__(
        self,
        zk: KazooClient,
        broker: BrokerInfo,
        on_assignment: Callable[[str, Assignment], None],
        session_timeout_ms: int,
    ) -> None:
        self.zk = zk
        self.broker = broker
        self.on_assignment = on_assignment
        self.session_timeout_ms = session_timeout_ms
        self.view = ClusterView()
        self.states = PartitionStates(zk)  # leader, epoch and ISR of every partition, for METADATA
        self._watched_topics: set[str] = set()
        self._lock = threading.Lock()  # guards replacing `view` and `_watched_topics`
        self._session_lost = False
        self._stopping = False
        self._connected_at = time.monotonic()  # when ZooKeeper was last (re)connected
        # the czxid of our broker node in the current session, None while unregistered:
        # a state node written before it cannot make this broker a leader (KIP-101)
        self.registered_zxid: int | None = None
        self.on_registered: Callable[[], None] = lambda: None
        self.on_removed: Callable[[str], None] = lambda topic: None

    def start(self) -> None:
        for path in (BROKER_IDS, BROKER_TOPICS, CONSUMERS, DELETE_TOPICS):
            self.zk.retry(self.zk.ensure_path, path)  # a lost connection must not end the start
        self.zk.add_listener(self._on_state)
        ChildrenWatch(self.zk, BROKER_TOPICS, self._on_topics)
        ChildrenWatch(self.zk, BROKER_IDS, self._on_brokers)

    def register(self) -> None:
        """Create our ephemeral node. After a crash, the previous session's node can
        linger until ZooKeeper expires it: wait for that, up to a session timeout.

        The connection may drop, or the session expire, while we wait (a broker paused
        during its start-up, a ZooKeeper server dying under it): retry for as long as it
        takes, since a broker that gives up here is one fewer replica once ZooKeeper is
        back, and a create that did land shows up as a node our own session owns."""
        data = encode_broker(self.broker, __version__)
        path = broker_path(self.broker.broker_id)
        # how long a previous session's node may stay, counted from when it was first seen
        # or from our last reconnection, whichever is later: ZooKeeper counts sessions'
        # timeouts afresh after an outage, and our calls block while it is away
        linger = 2 * self.session_timeout_ms / 1000 + 5
        first_seen: float | None = None
        delay = 0.2
        while not self._stopping:
            try:
                _, stat = self.zk.create(path, data, ephemeral=True, makepath=True, include_data=True)
                logger.info("registered broker %d at %s:%d", self.broker.broker_id, self.broker.host, self.broker.port)
                self._registered(stat.czxid)
                return
            except (ConnectionLoss, SessionExpiredError) as exc:
                logger.warning("registering broker %d at %s: %s; retrying in %.1fs",
                               self.broker.broker_id, path, type(exc).__name__, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
            except NodeExistsError:
                try:
                    _, stat = self.zk.get(path)
                except NoNodeError:
                    continue
                if stat.ephemeralOwner == self.zk.client_id[0]:
                    self._registered(stat.czxid)
                    return
                first_seen = first_seen or time.monotonic()
                if time.monotonic() > max(first_seen, self._connected_at) + linger:
                    raise UnknownError(
                        f"broker id {self.broker.broker_id} is registered by another live session at {path}; "
                        "is another broker running with the same broker.id?"
                    ) from None
                logger.info("waiting for the previous registration of broker %d to expire", self.broker.broker_id)
                time.sleep(0.5)
        raise UnknownError(f"broker {self.broker.broker_id} stopped before it registered")

    def _registered(self, czxid: int) -> None:
        self.registered_zxid = czxid
        self.on_registered()

    def _on_state(self, state: str) -> None:
        """kazoo's state listener: log every change; after a session loss, register again
        the moment the new session is connected. This runs in kazoo's event thread,
        which must not block on ZooKeeper calls, so the work goes to a thread.

        The watches need nothing here: kazoo's ChildrenWatch and DataWatch re-read and
        re-arm themselves on every CONNECTED, and our broker node's creation fires the
        /brokers/ids watch of every broker, this one included."""
        if self._stopping:
            return
        if state == KazooState.CONNECTED:
            self._connected_at = time.monotonic()
        if state == KazooState.LOST:
            self._session_lost = True
            self.registered_zxid = None
            logger.warning("ZooKeeper session lost (expired); broker %d is unregistered until it reconnects",
                           self.broker.broker_id)
        elif state == KazooState.SUSPENDED:
            logger.warning("ZooKeeper connection suspended; retrying (registration kept if the session survives)")
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            logger.info("ZooKeeper connected with a new session; registering broker %d again", self.broker.broker_id)
            threading.Thread(target=self._register_again, name="logbus-reregister", daemon=True).start()
        elif state == KazooState.CONNECTED:
            logger.info("ZooKeeper connection restored; session and registration kept")

    def _register_again(self) -> None:
        """Retry until registered: ZooKeeper may drop again while we try."""
        delay = 0.1
        while not self._stopping and not self._session_lost:
            try:
                self.register()
                return
            except Exception as exc:
                logger.warning("could not register broker %d again (%s); retrying in %.1fs",
                               self.broker.broker_id, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _on_brokers(self, children: list[str]) -> None:
        brokers = read_brokers(self.zk, children)
        with self._lock:
            self.view = ClusterView(brokers, self.view.topics, self.view.topic_ids)
        logger.info("live brokers: %s", sorted(brokers))

    def _on_topics(self, children: list[str]) -> None:
        for topic in children:
            with self._lock:
                if topic in self._watched_topics:
                    continue
                self._watched_topics.add(topic)
            DataWatch(self.zk, topic_path(topic), self._topic_watcher(topic))

    def _topic_watcher(self, topic: str) -> Callable[[bytes | None, object], bool | None]:
        # exactly two parameters: kazoo passes a third (the event) to callbacks that take one
        def watch(data: bytes | None, stat: object) -> bool | None:
            return self._on_topic_data(topic, data)

        return watch

    def _on_topic_data(self, topic: str, data: bytes | None) -> bool | None:
        if data is None:
            with self._lock:
                self._watched_topics.discard(topic)
                self.view = self.view.without(topic)
            self.on_removed(topic)
            return False  # stop watching a deleted topic
        try:
            assignment, topic_id = decode_assignment(data), decode_topic_id(data)
        except (ValueError, KeyError, TypeError):
            logger.error("ignoring unreadable assignment of topic %s: %r", topic, data[:200])
            return None
        self.apply_assignment(topic, assignment, topic_id)
        return None

    def apply_assignment(self, topic: str, assignment: Assignment, topic_id: str | None) -> None:
        """Make the view show the topic. A topic known under another id was deleted and
        created again while this broker did not look: the old one is removed first."""
        with self._lock:
            replaced = topic in self.view.topics and self.view.topic_ids.get(topic) != topic_id
            if replaced:
                self.view = self.view.without(topic)
        if replaced:
            logger.info("topic %s was deleted and created again (topic id %s)", topic, topic_id)
            self.on_removed(topic)
        with self._lock:
            self.view = ClusterView(self.view.brokers, {**self.view.topics, topic: assignment},
                                    {**self.view.topic_ids, topic: topic_id})
        self.states.watch(topic, assignment)
        self.on_assignment(topic, assignment)

    def create_topic(self, topic: str, partitions: int, replication_factor: int = 1) -> Assignment:
        assignment = create_topic(self.zk, topic, partitions, replication_factor, topic_id := uuid.uuid4().hex)
        self.apply_assignment(topic, assignment, topic_id)
        return assignment

    def ensure_topic(self, topic: str, partitions: int, replication_factor: int = 1) -> Assignment:
        """The topic's assignment, creating it if needed. When a concurrent creator won,
        read what it wrote rather than wait for the watch to deliver it; no node is a
        deletion under way (UnknownTopic: the name is free once it is complete)."""
        try:
            return self.create_topic(topic, partitions, replication_factor)
        except TopicAlreadyExists as exc:
            data = self.zk.exists(topic_path(topic)) and self.zk.get(topic_path(topic))[0]
            if not data:
                raise UnknownTopic(str(exc)) from None
            self.apply_assignment(topic, assignment := decode_assignment(data), decode_topic_id(data))
            return assignment

    def stop(self) -> None:
        self._stopping = True
        self.states.close()
        self.zk.stop()
        self.zk.close()
