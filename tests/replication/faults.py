"""Fault-injection hooks run inside a broker process (`LocalCluster.start_broker(...,
preamble=...)`): they hold one step of the broker's real code at a gate the test
controls, so that a race happens for certain instead of by luck. The broker's code is
otherwise untouched."""

from __future__ import annotations


def hold_commit_waits(gate: str) -> str:
    """A preamble under which acks=-1 answers, after their append, wait to start waiting
    for the high watermark while the file `gate` exists — the window between an append
    and its commit waiter, stretched so that leadership can move inside it."""
    return f"from tests.replication.faults import _hold_commit_waits; _hold_commit_waits({gate!r})"


def _hold_commit_waits(gate: str) -> None:
    import asyncio
    import os

    from broker.server.replication.manager import ReplicaManager

    original = ReplicaManager.wait_committed

    async def held(self, *args, **kwargs):
        while os.path.exists(gate):
            await asyncio.sleep(0.01)
        return await original(self, *args, **kwargs)

    ReplicaManager.wait_committed = held


def lose_each_zookeeper_path_once() -> str:
    """A preamble under which the first `ensure_path` of every path fails with
    ConnectionLoss, as when the ZooKeeper server a starting broker talks to dies under
    it: every ZooKeeper step of the start must retry, not end the broker."""
    return "from tests.replication.faults import _lose_each_zookeeper_path_once; _lose_each_zookeeper_path_once()"


def _lose_each_zookeeper_path_once() -> None:
    import sys

    from kazoo.client import KazooClient
    from kazoo.exceptions import ConnectionLoss

    original = KazooClient.ensure_path
    lost: set[str] = set()

    def ensure_path(self, path, *args, **kwargs):
        if path not in lost:
            lost.add(path)
            print(f"fault: ConnectionLoss injected into ensure_path({path})", file=sys.stderr, flush=True)
            raise ConnectionLoss()
        return original(self, path, *args, **kwargs)

    KazooClient.ensure_path = ensure_path


def expire_session_as_it_connects() -> str:
    """A preamble under which the broker's first ZooKeeper session expires the moment
    it is established, before the start goes on: a broker paused (a VM stall, a long
    GC) or a ZooKeeper server failing right after it connected. kazoo opens a new
    session by itself; the start must carry on with it, not end the broker."""
    return "from tests.replication.faults import _expire_session_as_it_connects; _expire_session_as_it_connects()"


def _expire_session_as_it_connects() -> None:
    import sys

    from kazoo.client import KazooClient, KazooState

    from harness.process import wait_until

    original = KazooClient.start_async
    expired: list[int] = []

    def start_async(self):
        event = original(self)
        answered = event.wait

        def wait(timeout=None):
            connected = answered(timeout)
            if connected and not expired:
                expired.append(self.client_id[0])
                # ZooKeeper's way to expire a session at will: a second client resumes
                # it, taking its connection, and closes it
                twin = KazooClient(",".join(f"{host}:{port}" for host, port in self.hosts),
                                   client_id=self.client_id)
                twin.start(30)
                twin.stop()
                twin.close()
                wait_until(lambda: self.state == KazooState.LOST, 30, "kazoo to notice its session expired")
                print(f"fault: session 0x{expired[0]:x} expired as it connected", file=sys.stderr, flush=True)
            return connected

        event.wait = wait
        return event

    KazooClient.start_async = start_async


def die_after_removing_topic_nodes() -> str:
    """A preamble under which the controller is killed -9 (SIGKILL to itself) the moment
    it has removed a deleted topic's nodes, before the groups' offsets, the record counts
    and the marker: a deletion cut in the middle, for the next controller to finish."""
    return "from tests.replication.faults import _die_after_removing_topic_nodes; _die_after_removing_topic_nodes()"


def _die_after_removing_topic_nodes() -> None:
    import os
    import signal
    import sys

    from broker.server.topicdeleter import TopicDeleter

    def remove_references(self, topic):
        print(f"fault: controller killed -9 midway through deleting {topic}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    TopicDeleter._remove_references = remove_references


def refuse_each_partitions_first_append(topic: str) -> str:
    """A preamble under which the first append to each partition of `topic` is refused
    with UnknownTopic, as a broker that learns of a topic after the producer does
    answers, while the requests behind it in flight are appended: the race in which a
    producer's first batch fails and its next ones land (docs/protocol.md, the
    producer state's floor)."""
    return (f"from tests.replication.faults import _refuse_each_partitions_first_append; "
            f"_refuse_each_partitions_first_append({topic!r})")


def _refuse_each_partitions_first_append(topic: str) -> None:
    import sys

    from broker.common.errors import UnknownTopic
    from broker.server.handlers import RequestHandler

    original = RequestHandler._append
    refused: set[int] = set()

    def _append(self, name, partition, messages, acks):
        if name == topic and partition not in refused:
            refused.add(partition)
            print(f"fault: UnknownTopic injected into the first append to {name}-{partition}", file=sys.stderr,
                  flush=True)
            raise UnknownTopic(f"unknown topic {name!r} (injected: the broker learns of it late)")
        return original(self, name, partition, messages, acks)

    RequestHandler._append = _append
