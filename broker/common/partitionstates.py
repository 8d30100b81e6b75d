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

from kazoo.client import KazooClient
from kazoo.recipe.watchers import DataWatch

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
    guards starting a watch only once per partition."""

    def __init__(self, zk: KazooClient, on_change: Callable[[], None] | None = None) -> None:
        self.zk = zk
        self.on_change = on_change
        self._states: dict[Key, PartitionState] = {}
        self._watched: set[Key] = set()
        self._lock = threading.Lock()
        self.closed = False

    def watch(self, topic: str, partitions: Iterable[int]) -> None:
        """Watch these partitions' state nodes (from now on; the first read happens here)."""
        for partition in partitions:
            key = (topic, partition)
            with self._lock:
                if key in self._watched:
                    continue
                self._watched.add(key)
            DataWatch(self.zk, partition_state_path(topic, partition), self._watcher(key))

    def _watcher(self, key: Key) -> Callable[[bytes | None, object], bool | None]:
        # exactly two parameters: kazoo passes a third (the event) to callbacks that take one
        def watch(data: bytes | None, stat: object) -> bool | None:
            return self._on_data(key, data)

        return watch

    def _on_data(self, key: Key, data: bytes | None) -> bool | None:
        if self.closed:
            return False
        states = dict(self._states)
        if data is None:
            states.pop(key, None)
        else:
            try:
                states[key] = PartitionState.decode(data)
            except (ValueError, KeyError, TypeError):
                logger.error("ignoring unreadable state of %s-%d: %r", *key, data[:200])
                return None
        self._states = states
        if self.on_change is not None:
            self.on_change()
        return None

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
