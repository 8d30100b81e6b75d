"""What the replication tests share: the brokers' settings (short lag and session
timeouts so faults bite within a second or two), creating a replicated topic and
waiting for its leaders, sending with a given acks, and waiting on partition state."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

from kazoo.client import KazooClient

from broker.client.connection import BrokerConnection
from broker.client.producer import Producer
from broker.zklayout import read_assignment
from harness.process import wait_until
from tests.replication.history import read_replica

LAG_MS = 1000
SESSION_MS = 2000  # the ensemble's tick is 500 ms: sessions of 1 to 10 s are allowed
BROKER_SETTINGS = {
    "log.flush.interval.ms": 20,
    "replica.lag.time.max.ms": LAG_MS,
    "zookeeper.session.timeout.ms": SESSION_MS,
    "min.insync.replicas": 1,
    "replica.fetch.wait.max.ms": 50,  # a follower's long poll: see `pause_quietly`
}


def pause_quietly(cluster, broker_ids: list[int]) -> None:
    """SIGSTOP followers so that they get nothing more: a fetch already sent is still
    answered into the paused process's socket (and appended on SIGCONT), so wait out
    the long poll (`replica.fetch.wait.max.ms`) — well within the lag time."""
    for broker_id in broker_ids:
        cluster.brokers[broker_id].pause()
    time.sleep(0.25)


@contextlib.contextmanager
def zookeeper_client(connect: str) -> Iterator[KazooClient]:
    """A client that rides out one stopped server of an ensemble."""
    zk = KazooClient(connect, connection_retry={"max_tries": -1, "max_delay": 1},
                     command_retry={"max_tries": -1, "max_delay": 1})
    zk.start(30)
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


def state(zk: KazooClient, topic: str, partition: int):
    from broker.zklayout import read_partition_state  # replication's (issue 11)

    return zk.retry(read_partition_state, zk, topic, partition)[0]


def wait_for_state(zk: KazooClient, topic: str, partition: int, condition: Callable[[object], bool], what: str,
                   timeout: float = 30):
    """The partition's state once `condition(state)` holds."""
    return wait_until(lambda: (lambda s: s if condition(s) else None)(state(zk, topic, partition)), timeout,
                      f"{topic}-{partition}: {what}", 0.1)


def create_replicated_topic(cluster, zk: KazooClient, topic: str, partitions: int,
                            replication_factor: int) -> dict[int, list[int]]:
    """CREATE_TOPIC at a live broker; returns {partition: replicas} once every
    partition has its preferred leader and a full ISR."""
    broker = next(b for b in cluster.brokers.values() if b.alive)
    with BrokerConnection(*broker.address) as connection:
        connection.create_topic(topic, partitions, replication_factor)
    assignment = wait_until(lambda: zk.retry(read_assignment, zk, topic), 30, f"topic {topic}")
    for partition, replicas in assignment.items():
        wait_for_state(zk, topic, partition, lambda s, r=replicas: s.leader == r[0] and sorted(s.isr) == sorted(r),
                       f"leader {replicas[0]} and ISR {replicas}")
    return {int(p): list(r) for p, r in assignment.items()}


def send(zookeeper: str, topic: str, partition: int, values: list[bytes], acks: int) -> list[int]:
    """Send one at a time with `acks` (retrying leader moves); each message's offset."""
    with Producer(zookeeper=zookeeper, acks=acks, audit=False, retries=50, retry_backoff_ms=100,
                  delivery_timeout_ms=30_000) as producer:
        return [producer.send(topic, value, partition=partition).offset for value in values]


def wait_identical(cluster, topic: str, partition: int, replicas: list[int], timeout: float = 30) -> bytes:
    """The partition's bytes once every replica holds the same (the followers caught up)."""
    def same() -> bool:
        return len({read_replica(cluster.brokers[b].log_dir, topic, partition) for b in replicas}) == 1
    try:
        wait_until(same, timeout, f"the replicas of {topic}-{partition} to be identical", 0.1)
    except TimeoutError:
        sizes = {b: len(read_replica(cluster.brokers[b].log_dir, topic, partition)[1]) for b in replicas}
        raise AssertionError(f"replicas of {topic}-{partition} still differ after {timeout}s: sizes {sizes}") from None
    return read_replica(cluster.brokers[replicas[0]].log_dir, topic, partition)[1]
