"""Helpers for the replication data-path tests: a replicated topic, its leader, the
state node, and byte-level comparison of replicas' segment files."""

from __future__ import annotations

from pathlib import Path

from kazoo.client import KazooClient

from broker.errors import LogbusError
from broker.zklayout import PartitionState, create_topic, read_partition_state, write_partition_state
from harness.cluster import LocalCluster
from harness.process import wait_until
from tests.integration.brokerutil import connect


def replicated_topic(zk: KazooClient, cluster: LocalCluster, topic: str, replication_factor: int = 3,
                     partitions: int = 1) -> dict:
    """Create the topic in ZooKeeper and wait until each partition's leader acts as one."""
    assignment = create_topic(zk, topic, partitions, replication_factor=replication_factor)
    for partition, replicas in assignment.items():
        wait_leading(cluster, replicas[0], topic, partition)
    return assignment


def wait_leading(cluster: LocalCluster, broker_id: int, topic: str, partition: int = 0, timeout: float = 30) -> None:
    """Wait until `broker_id` answers OFFSETS for the partition: it has taken the lead."""
    def leading():
        try:
            with connect(cluster.brokers[broker_id]) as conn:
                conn.offsets(topic, partition, -1)
            return True
        except LogbusError:
            return False

    wait_until(leading, timeout, f"broker {broker_id} to lead {topic}-{partition}", interval=0.1)


def state(zk: KazooClient, topic: str, partition: int = 0) -> PartitionState:
    return read_partition_state(zk, topic, partition)[0]


def set_state(zk: KazooClient, topic: str, partition: int, new: PartitionState) -> None:
    """Write the state node as the controller would (the controller is another helper's
    work: these tests move leadership by writing the node directly)."""
    version = read_partition_state(zk, topic, partition).version
    assert write_partition_state(zk, topic, partition, new, version) is not None


def segments(cluster: LocalCluster, broker_id: int, topic: str, partition: int = 0) -> list[tuple[str, bytes]]:
    directory = Path(cluster.brokers[broker_id].log_dir) / f"{topic}-{partition}"
    return [(p.name, p.read_bytes()) for p in sorted(directory.glob("*.kafka"))]


def wait_identical(cluster: LocalCluster, broker_ids: list[int], topic: str, partition: int = 0,
                   timeout: float = 30) -> list[tuple[str, bytes]]:
    """Wait until the replicas' segment files are byte-identical; return them."""
    def same():
        files = [segments(cluster, b, topic, partition) for b in broker_ids]
        return files[0] if all(f == files[0] for f in files) else None

    return wait_until(same, timeout, f"replicas {broker_ids} of {topic}-{partition} to be identical")


def wait_isr(zk: KazooClient, topic: str, isr: set[int], partition: int = 0, timeout: float = 30) -> None:
    wait_until(lambda: set(state(zk, topic, partition).isr) == isr, timeout, f"isr of {topic}-{partition} to be {isr}")
