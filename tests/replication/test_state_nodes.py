"""The partition state nodes in a real ZooKeeper: created with the topic in one
transaction, then changed only by compare-and-set (broker/common/zklayout.py)."""

import pytest

from broker.common.errors import InvalidReplicationFactor, TopicAlreadyExists
from broker.common.zklayout import (
    PartitionState, broker_path, create_topic, encode_assignment, partition_state_path, read_partition_state,
    topic_path, write_partition_state,
)


def register(zk, *ids):
    for i in ids:
        zk.create(broker_path(i), b'{"host": "127.0.0.1", "port": 1, "version": "t"}', ephemeral=True, makepath=True)


def test_create_topic_writes_the_initial_state_of_every_partition(zk):
    register(zk, 0, 1, 2)
    assignment = create_topic(zk, "r3", 2, replication_factor=3)
    for partition, replicas in assignment.items():
        state, version, _ = read_partition_state(zk, "r3", partition)
        assert state == PartitionState(replicas[0], 0, replicas)
        assert version == 0
    with pytest.raises(TopicAlreadyExists):
        create_topic(zk, "r3", 2, replication_factor=3)
    with pytest.raises(InvalidReplicationFactor):
        create_topic(zk, "too-many", 1, replication_factor=4)
    assert zk.exists(topic_path("too-many")) is None


def test_state_changes_only_by_compare_and_set(zk):
    register(zk, 0, 1)
    create_topic(zk, "cas", 1, replication_factor=2)
    state, version, written = read_partition_state(zk, "cas", 0)
    shrunk = PartitionState(state.leader, 0, [state.leader])
    assert write_partition_state(zk, "cas", 0, shrunk, version) == version + 1
    assert write_partition_state(zk, "cas", 0, state, version) is None  # lost: the node moved on
    after = read_partition_state(zk, "cas", 0)
    assert after[:2] == (shrunk, version + 1)
    assert after.mzxid > written  # the write's zxid: what a later registration is compared with


def test_a_topic_without_state_nodes_reads_as_led_by_its_first_replica(zk):
    zk.create(topic_path("old"), encode_assignment({0: [2, 1]}), makepath=True)
    assert read_partition_state(zk, "old", 0)[:2] == (PartitionState(2, 0, [2]), -1)
    assert read_partition_state(zk, "old", 1) is None
    assert read_partition_state(zk, "missing", 0) is None
    assert write_partition_state(zk, "old", 0, PartitionState(2, 0, [2, 1]), -1) == 0
    assert zk.exists(partition_state_path("old", 0)) is not None
