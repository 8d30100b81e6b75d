"""Opening a ZooKeeper session, for brokers and clients alike."""

from __future__ import annotations

from kazoo.client import KazooClient


def start_session(zk: KazooClient, timeout_s: float) -> None:
    """Start `zk`; give up, stopped, only if no ZooKeeper server answers within
    `timeout_s` (`zookeeper.connection.timeout.ms`, as Kafka's broker does).

    Not kazoo's `start`: it looks at the connection again once its wait is over and gives
    up if the connection was lost by then — a process paused right after connecting, its
    session expired meanwhile, or a server dying under it — although kazoo is already
    reconnecting, with a new session if need be. Being answered once is enough: what
    follows retries a lost connection or session (kazoo's `retry`, its watches)."""
    if not zk.start_async().wait(timeout_s):  # True once connected, even if lost since
        zk.stop()
        zk.close()
        raise zk.handler.timeout_exception(f"no ZooKeeper server answered within {timeout_s:g} s")
