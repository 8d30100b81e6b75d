"""Partition state nodes (leader, leader epoch, ISR) kept current by kazoo watches.

Brokers answer METADATA from it and clients route requests by it (both import it: it
depends only on the ZooKeeper layout). A partition without a state node belongs to a
topic created before replication: its leader is its first replica, ISR = [leader],
epoch 0 (docs/zookeeper.md). A leader that is not registered is reported as -1, like
an offline partition: clients wait for the controller to move it.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import WatchedEvent

from broker.common.zklayout import PartitionState, partition_state_path, read_partition_state

logger = logging.getLogger(__name__)

Key = tuple[str, int]


def legacy_state(replicas: list[int]) -> PartitionState:
    """The state of a partition that has no state node."""
    return PartitionState(leader=replicas[0], leader_epoch=0, isr=[replicas[0]], controller_epoch=0)


def live_leader(state: PartitionState, live: Iterable[int]) -> int:
    """The leader clients should use: -1 while it is offline or not registered."""
    return state.leader if state.leader >= 0 and state.leader in live else -1


class PartitionStates:
    """`_states` is replaced whole on every change, so readers need no lock; `_lock`
    guards `_watched`, `_applying` one replacement at a time (answers come in several
    threads; an answer older than the one applied — by the node's mzxid — is dropped).

    Each state node is read with a one-shot ZooKeeper watch that is set again by every
    read it triggers (kazoo's DataWatch, done by hand): a topic's nodes are all asked
    for at once, pipelined on the session, and their first answers applied in one
    batch — a DataWatch each read them one round trip after another, and replacing
    the dict per node made 10,000 partitions cost seconds. After a disconnection every
    node is read again (`_on_session`)."""

    def __init__(self, zk: KazooClient, on_change: Callable[[], None] | None = None) -> None:
        self.zk = zk
        self.on_change = on_change
        self._states: dict[Key, PartitionState] = {}
        self._watched: set[Key] = set()
        self._lock = threading.Lock()
        self._applying = threading.Lock()
        self._mzxids: dict[Key, int] = {}  # the applied version of each node
        self._disconnected = False
        self.closed = False
        zk.add_listener(self._on_session)

    def watch(self, topic: str, partitions: Iterable[int]) -> None:
        """Watch these partitions' state nodes; returns once their first reads are
        applied (so a caller sees them at once)."""
        with self._lock:
            keys = [(topic, p) for p in partitions if (topic, p) not in self._watched]
            self._watched.update(keys)
        self._read(keys)

    def _read(self, keys: list[Key]) -> None:
        """Read `keys` with watches set, pipelined; apply the answers in one batch."""
        asked = [(key, self.zk.get_async(partition_state_path(*key), watch=self._fired)) for key in keys]
        answers: dict[Key, tuple[bytes, int] | None] = {}
        for key, result in asked:
            try:
                data, stat = result.get()
                answers[key] = (data, stat.mzxid)
            except NoNodeError:
                answers[key] = None  # a legacy partition (no node) or not yet written: watch its creation
                self._watch_creation(key)
            except Exception as exc:  # connection trouble: every node is read again once connected
                logger.warning("cannot read the state of %s-%d: %s", *key, exc)
        self._apply(answers)

    def _watch_creation(self, key: Key) -> None:
        try:
            if self.zk.exists(partition_state_path(*key), watch=self._fired) is not None:
                self._read([key])  # created meanwhile
        except Exception as exc:
            logger.warning("cannot watch the state of %s-%d: %s", *key, exc)

    def _fired(self, event: WatchedEvent) -> None:
        """A watched node changed (kazoo's event thread): read it again, watch set again."""
        if self.closed or not event.path:
            return
        key = _key_of(event.path)
        if key is None:
            return
        self.zk.handler.spawn(self._read, [key])

    def _on_session(self, state: str) -> None:
        """kazoo drops every one-shot watch when the connection drops — even when the
        session survives and it reconnects to another server — telling each watcher with
        a path-less event (it does not set them again on the new connection). So after
        any disconnection every node is read again, which sets the watches again; until
        then the states are as last read."""
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            self._disconnected = True
        elif state == KazooState.CONNECTED and self._disconnected and not self.closed:
            self._disconnected = False
            with self._lock:
                keys = sorted(self._watched)
            self.zk.handler.spawn(self._read, keys)

    def _apply(self, answers: dict[Key, tuple[bytes, int] | None]) -> None:
        if self.closed or not answers:
            return
        with self._applying:  # reads answer in several threads: one replacement at a time
            self._replace(answers)
        if self.on_change is not None:
            self.on_change()

    def _replace(self, answers: dict[Key, tuple[bytes, int] | None]) -> None:
        states = dict(self._states)
        for key, answer in answers.items():
            if answer is None:
                states.pop(key, None)
                self._mzxids.pop(key, None)
                continue
            data, mzxid = answer
            if mzxid < self._mzxids.get(key, -1):
                continue  # a read that started before the one already applied
            self._mzxids[key] = mzxid
            try:
                states[key] = PartitionState.decode(data)
            except (ValueError, KeyError, TypeError):
                logger.error("ignoring unreadable state of %s-%d: %r", *key, data[:200])
        self._states = states

    def reread(self, topic: str, partitions: Iterable[int]) -> None:
        """Read these state nodes now (a client that was just told NotLeader need not
        wait for the watch to fire)."""
        self.watch(topic, partitions)
        states = dict(self._states)
        for partition in partitions:
            current = read_partition_state(self.zk, topic, partition)
            if current is None:
                states.pop((topic, partition), None)
            else:
                states[(topic, partition)] = current[0]
        self._states = states

    def get(self, topic: str, partition: int, replicas: list[int]) -> PartitionState:
        """The partition's state; the legacy state if it has no state node."""
        state = self._states.get((topic, partition))
        return state if state is not None else legacy_state(replicas)

    def close(self) -> None:
        self.closed = True
        self.zk.remove_listener(self._on_session)


def _key_of(path: str) -> Key | None:
    """(topic, partition) of a state node's path (`zklayout.partition_state_path`)."""
    parts = path.rstrip("/").split("/")
    try:
        return parts[-4], int(parts[-2])
    except (IndexError, ValueError):
        return None
