"""What the replication tests share: the brokers' settings (short lag and session
timeouts so faults bite within a second or two), creating a replicated topic and
waiting for its leaders, sending with a given acks, reading, writing and waiting on
partition state, and byte-level comparison of the replicas' segment files."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable, Iterator

from kazoo.client import KazooClient

from broker.client.connection import BrokerConnection
from broker.client.producer import Producer
from broker.client.security import OPEN, ClientSecurity
from broker.common.errors import LogbusError
from broker.common.zkauth import NO_AUTH, ZooKeeperAuth
from broker.common.zklayout import (
    PartitionState, partition_state_path, read_assignment, read_partition_state, write_partition_state,
)
from harness.process import wait_until

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
def zookeeper_client(connect: str, auth: ZooKeeperAuth = NO_AUTH) -> Iterator[KazooClient]:
    """A client that rides out one stopped server of an ensemble (with `auth`, the
    brokers' identity on a secured ZooKeeper)."""
    zk = KazooClient(connect, connection_retry={"max_tries": -1, "max_delay": 1},
                     command_retry={"max_tries": -1, "max_delay": 1}, **auth.client_kwargs())
    zk.start(30)
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


def state(zk: KazooClient, topic: str, partition: int = 0) -> PartitionState:
    """The state node as the ZooKeeper leader has it: the test's server may lag the one a
    broker wrote through (reads are not linearizable), so sync first."""
    zk.retry(zk.sync, partition_state_path(topic, partition))
    return zk.retry(read_partition_state, zk, topic, partition).state


def set_state(zk: KazooClient, topic: str, partition: int, new: PartitionState) -> None:
    """Write the state node as the controller would (compare-and-set), to move
    leadership by hand in tests of the data path alone."""
    version = read_partition_state(zk, topic, partition).version
    assert write_partition_state(zk, topic, partition, new, version) is not None


def wait_for_state(zk: KazooClient, topic: str, partition: int, condition: Callable[[object], bool], what: str,
                   timeout: float = 30):
    """The partition's state once `condition(state)` holds."""
    return wait_until(lambda: (lambda s: s if condition(s) else None)(state(zk, topic, partition)), timeout,
                      f"{topic}-{partition}: {what}", 0.1)


def wait_isr(zk: KazooClient, topic: str, isr: set[int], partition: int = 0, timeout: float = 30) -> None:
    wait_for_state(zk, topic, partition, lambda s: set(s.isr) == isr, f"the ISR to be {sorted(isr)}", timeout)


def wait_leading(cluster, broker_id: int, topic: str, partition: int = 0, timeout: float = 30,
                 security: ClientSecurity = OPEN) -> None:
    """Wait until `broker_id` answers OFFSETS for the partition: it has taken the lead."""
    def leading() -> bool:
        try:
            with BrokerConnection(*cluster.brokers[broker_id].address, security=security) as connection:
                connection.offsets(topic, partition, -1)
            return True
        except (LogbusError, OSError):
            return False

    wait_until(leading, timeout, f"broker {broker_id} to lead {topic}-{partition}", 0.1)


def create_replicated_topic(cluster, zk: KazooClient, topic: str, partitions: int = 1,
                            replication_factor: int = 3, security: ClientSecurity = OPEN) -> dict[int, list[int]]:
    """CREATE_TOPIC at a live broker; returns {partition: replicas} once every
    partition has its preferred leader, acting as one, and a full ISR."""
    broker = next(b for b in cluster.brokers.values() if b.alive)
    with BrokerConnection(*broker.address, security=security) as connection:
        connection.create_topic(topic, partitions, replication_factor)
    assignment = wait_until(lambda: zk.retry(read_assignment, zk, topic), 30, f"topic {topic}")
    for partition, replicas in assignment.items():
        wait_for_state(zk, topic, partition, lambda s, r=replicas: s.leader == r[0] and sorted(s.isr) == sorted(r),
                       f"leader {replicas[0]} and ISR {replicas}")
        wait_leading(cluster, replicas[0], topic, partition, security=security)
    return {int(p): list(r) for p, r in assignment.items()}


def send(zookeeper: str, topic: str, partition: int, values: list[bytes], acks: int) -> list[int]:
    """Send one at a time with `acks` (retrying leader moves); each message's offset."""
    with Producer(zookeeper=zookeeper, acks=acks, monitoring=False, retries=50, retry_backoff_ms=100,
                  delivery_timeout_ms=30_000) as producer:
        return [producer.send(topic, value, partition=partition).offset for value in values]


def segments(cluster, broker_id: int, topic: str, partition: int = 0) -> list[tuple[str, bytes]]:
    """A replica's segment files, (name, bytes), in offset order."""
    directory = Path(cluster.brokers[broker_id].log_dir) / f"{topic}-{partition}"
    return [(p.name, p.read_bytes()) for p in sorted(directory.glob("*.kafka"), key=lambda p: int(p.stem))]


def wait_identical(cluster, topic: str, partition: int, replicas: list[int], timeout: float = 30) -> bytes:
    """The partition's bytes once every replica holds the same segment files, names and
    bytes (the followers caught up, and rolled where the leader did)."""
    def same() -> bool:
        files = [segments(cluster, b, topic, partition) for b in replicas]
        return all(f == files[0] for f in files)
    try:
        wait_until(same, timeout, f"the replicas of {topic}-{partition} to be identical", 0.1)
    except TimeoutError:
        sizes = {b: sum(len(d) for _, d in segments(cluster, b, topic, partition)) for b in replicas}
        raise AssertionError(f"replicas of {topic}-{partition} still differ after {timeout}s: sizes {sizes}") from None
    return b"".join(data for _, data in segments(cluster, replicas[0], topic, partition))


def kill_leader_and_wait_back(cluster, zk: KazooClient, topic: str, partition: int = 0) -> int:
    """SIGKILL the partition's leader, wait for another to lead, restart the killed one
    and wait until it is back in the ISR; returns the killed broker's id."""
    leader = state(zk, topic, partition).leader
    cluster.brokers[leader].kill()
    wait_for_state(zk, topic, partition, lambda s: s.leader not in (-1, leader), "a new leader", 60)
    cluster.start_broker(leader, BROKER_SETTINGS, wait=False)
    wait_for_state(zk, topic, partition, lambda s: len(s.isr) == 3, "the killed broker back in the ISR", 60)
    return leader
