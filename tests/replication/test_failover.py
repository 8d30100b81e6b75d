"""acks=-1 against min.insync.replicas, unclean leader election off and on, and a
leader's loss as producers and consumer groups see it — real brokers on a ZooKeeper
ensemble, leadership moved by the controller when brokers die."""

from __future__ import annotations

import pytest

from broker.client.errors import ConsumerTimeout, ProduceError
from broker.client.group import ConsumerGroup
from broker.client.producer import Producer
from broker.errors import NotEnoughReplicas
from broker.message import iter_messages
from harness.cluster import LocalCluster
from tests.replication.history import read_replica
from tests.replication.replicated import (
    BROKER_SETTINGS, create_replicated_topic, wait_for_state, wait_identical, zookeeper_client,
)


def producer(cluster, acks: int, retries: int = 100) -> Producer:
    return Producer(zookeeper=cluster.zookeeper, acks=acks, audit=False, retries=retries, retry_backoff_ms=100,
                    delivery_timeout_ms=60_000)


def test_acks_all_is_refused_below_min_insync_replicas_and_acks_1_is_accepted(zookeeper_ensemble, tmp_path):
    settings = {**BROKER_SETTINGS, "min.insync.replicas": 2}
    with LocalCluster(zookeeper_ensemble.connect_string, tmp_path, settings=settings) as cluster, \
            zookeeper_client(zookeeper_ensemble.connect_string) as zk:
        cluster.start(3)
        leader, *followers = create_replicated_topic(cluster, zk, "t", partitions=1, replication_factor=3)[0]
        with producer(cluster, -1, retries=0) as all_isr, producer(cluster, 1, retries=0) as leader_only:
            all_isr.send("t", b"three in sync", partition=0)
            for follower in followers:
                cluster.brokers[follower].kill()
            wait_for_state(zk, "t", 0, lambda s: list(s.isr) == [leader], f"the ISR down to {leader}")
            with pytest.raises(ProduceError) as refused:
                all_isr.send("t", b"one in sync", partition=0)
            assert isinstance(refused.value.cause, NotEnoughReplicas), refused.value
            accepted = leader_only.send("t", b"acks=1", partition=0)
        _, data = read_replica(cluster.brokers[leader].log_dir, "t", 0)
        assert [m.value for m in iter_messages(data, 0)] == [b"three in sync", b"acks=1"]
        assert accepted.offset == len(data) - len(b"acks=1") - 22


@pytest.mark.parametrize("unclean", [False, True])
def test_what_is_kept_with_only_an_out_of_sync_replica_left(zookeeper_ensemble, tmp_path, unclean):
    """Off (the default): the partition stays offline until an ISR member returns, and
    loses nothing. On: the out-of-sync replica leads, and what only the dead leader
    had is lost — the documented cost."""
    settings = {**BROKER_SETTINGS, "unclean.leader.election.enable": str(unclean).lower()}
    with LocalCluster(zookeeper_ensemble.connect_string, tmp_path, settings=settings) as cluster, \
            zookeeper_client(zookeeper_ensemble.connect_string) as zk:
        cluster.start(3)
        a, b = create_replicated_topic(cluster, zk, "t", partitions=1, replication_factor=2)[0]
        with producer(cluster, -1) as all_isr:
            all_isr.send("t", b"on both", partition=0)
            cluster.brokers[b].pause()
            wait_for_state(zk, "t", 0, lambda s: list(s.isr) == [a], f"the ISR shrunk to {a}")
            all_isr.send("t", b"only on a", partition=0)  # min.insync.replicas=1: the leader acks alone
            cluster.brokers[a].kill()
            cluster.brokers[b].resume()
            if not unclean:
                wait_for_state(zk, "t", 0, lambda s: s.leader == -1, "offline")
                cluster.start_broker(a)
                wait_for_state(zk, "t", 0, lambda s: s.leader == a, f"{a} leading again", timeout=60)
                all_isr.send("t", b"after", partition=0)
                expected = [b"on both", b"only on a", b"after"]
            else:
                wait_for_state(zk, "t", 0, lambda s: s.leader == b, f"{b} leading, uncleanly", timeout=60)
                all_isr.send("t", b"after", partition=0)
                cluster.start_broker(a)
                expected = [b"on both", b"after"]  # "only on a" is lost: a truncates to b's log
            wait_for_state(zk, "t", 0, lambda s: sorted(s.isr) == sorted([a, b]), "both in sync", timeout=60)
        data = wait_identical(cluster, "t", 0, [a, b])
        assert [m.value for m in iter_messages(data, 0)] == expected


def drain(group: ConsumerGroup, topic: str, count: int) -> list[bytes]:
    stream, got = group.streams[topic][0], []
    while len(got) < count:
        try:
            got.extend(m.value for _, m in zip(range(count - len(got)), stream))
        except ConsumerTimeout:
            continue
    return got


def test_a_leader_loss_costs_producers_only_retries_and_a_group_continues_where_it_was(zookeeper_ensemble,
                                                                                       tmp_path):
    with LocalCluster(zookeeper_ensemble.connect_string, tmp_path, settings=BROKER_SETTINGS) as cluster, \
            zookeeper_client(zookeeper_ensemble.connect_string) as zk:
        cluster.start(3)
        leader = create_replicated_topic(cluster, zk, "orders", partitions=1, replication_factor=3)[0][0]
        before = [b"before-%d" % i for i in range(20)]
        after = [b"after-%d" % i for i in range(20)]
        settings = dict(auto_commit_interval_ms=0, consumer_timeout_ms=500, max_wait_ms=100,
                        zookeeper_session_timeout_ms=2000)
        with producer(cluster, -1) as send:
            for value in before:
                send.send("orders", value, partition=0)
            group = ConsumerGroup("g", {"orders": 1}, cluster.zookeeper, **settings)
            try:
                assert drain(group, "orders", 20) == before
                group.commit()
            finally:
                group.close()
            cluster.brokers[leader].kill()
            for value in after:  # raises if any send fails after its retries
                send.send("orders", value, partition=0)
        new = wait_for_state(zk, "orders", 0, lambda s: s.leader not in (leader, -1), "a new leader")
        group = ConsumerGroup("g", {"orders": 1}, cluster.zookeeper, **settings)
        try:
            assert drain(group, "orders", 20) == after
        finally:
            group.close()
        assert new.leader != leader
