"""The client's offsets and exact byte-range reads (broker.client.offsets, .ranges)
against real brokers: the same bytes through ZooKeeper and through static brokers,
group offsets that only move forward, a dead leader named in the error at once or after
the pool's `leader_wait`, and a leader that returns within it waited for."""

from __future__ import annotations

import logging
import threading

import pytest

from broker.client import offsets, ranges
from broker.client.cluster import ConnectionPool
from broker.client.metadata import open_metadata
from broker.client.producer import Producer
from harness.process import wait_until
from broker.common.message import iter_messages
from broker.common.zklayout import create_topic, read_offset
from tests.integration.clientutil import wait_visible

TOPIC = "ranged"


@pytest.fixture
def two_brokers(cluster, zk, zk_connect):
    cluster.start_broker(0)
    cluster.start_broker(1)
    create_topic(zk, TOPIC, 2)
    with Producer(zookeeper=zk_connect, monitoring=False, enable_idempotence=False) as producer:  # one entry a message
        for i in range(300):
            producer.send(TOPIC, b"v%03d" % i, partition=i % 2)
    wait_visible(zk_connect, TOPIC, 300)
    return cluster


def pool_of(leader_wait: float = 0.0, **where) -> ConnectionPool:
    return ConnectionPool(open_metadata(**where), "test", 10.0, leader_wait)


def read_all(pool: ConnectionPool, fetch_bytes: int) -> dict[int, bytes]:
    out = {}
    for p, o in offsets.partition_offsets(pool, TOPIC).items():
        out[p] = b"".join(buf for _, buf in ranges.read_range(pool, TOPIC, p, o.earliest, o.latest, fetch_bytes))
    return out


def test_range_reads_through_zookeeper_and_static_brokers_give_the_same_whole_messages(two_brokers, zk_connect):
    addresses = [f"{host}:{port}" for host, port in (b.address for b in two_brokers.brokers.values())]
    by_zookeeper, by_brokers = pool_of(zookeeper=zk_connect), pool_of(brokers=addresses)
    try:
        read = read_all(by_zookeeper, fetch_bytes=100)
        assert read == read_all(by_brokers, fetch_bytes=1 << 20)
    finally:
        for pool in (by_zookeeper, by_brokers):
            pool.close()
            pool.metadata.close()
    values = {p: [m.value for m in iter_messages(buf, 0)] for p, buf in read.items()}
    assert values == {p: [b"v%03d" % i for i in range(p, 300, 2)] for p in (0, 1)}


def test_a_range_from_a_segment_start_to_a_boundary_ends_exactly_there(two_brokers, zk_connect):
    pool = pool_of(zookeeper=zk_connect)
    try:
        end = ranges.boundary_at_or_before(pool, TOPIC, 0, 0, 100)
        sets = list(ranges.read_range(pool, TOPIC, 0, 0, end))
        assert offsets.segment_starts(pool, TOPIC, 0) == [0]
    finally:
        pool.close()
        pool.metadata.close()
    assert end == 3 * 26  # 26-byte entries: the last boundary within 100 bytes
    assert [m.value for _, buf in sets for m in iter_messages(buf, 0)] == [b"v000", b"v002", b"v004"]


def test_group_offsets_only_move_forward(two_brokers, zk, zk_connect):
    offsets.advance_group_offsets(zk, "g", TOPIC, {0: 104, 1: 52})
    offsets.advance_group_offsets(zk, "g", TOPIC, {0: 52, 1: 78})
    assert offsets.group_offsets(zk, "g", TOPIC, [0, 1, 2]) == {0: 104, 1: 78}
    assert read_offset(zk, "g", TOPIC, 2) is None


def test_a_dead_leader_fails_at_once_naming_partition_and_broker(two_brokers, zk_connect):
    pool = pool_of(zookeeper=zk_connect)
    try:
        partition = next(p for p, leader in offsets.assigned_leaders(pool, TOPIC).items() if leader == 1)
        two_brokers.brokers[1].stop()
        wait_until(lambda: 1 not in pool.metadata.brokers(), 30, "broker 1 to leave")
        with pytest.raises(ConnectionError, match=f"leader broker 1 of {TOPIC}-{partition} is not live"):
            offsets.latest(pool, TOPIC, partition)
        assert offsets.latest(pool, TOPIC, 1 - partition) > 0  # the other partition stays readable
    finally:
        pool.close()
        pool.metadata.close()


def test_a_leader_back_within_leader_wait_is_waited_for_and_one_that_is_not_is_named(two_brokers, zk_connect,
                                                                                     caplog):
    caplog.set_level(logging.WARNING, logger="broker.client.cluster")
    pool = pool_of(leader_wait=30, zookeeper=zk_connect)
    try:
        partition = next(p for p, leader in offsets.assigned_leaders(pool, TOPIC).items() if leader == 1)
        end = offsets.latest(pool, TOPIC, partition)
        two_brokers.brokers[1].stop()
        wait_until(lambda: 1 not in pool.metadata.brokers(), 30, "broker 1 to leave")
        read: list = []
        reader = threading.Thread(target=lambda: read.extend(ranges.read_range(pool, TOPIC, partition, 0, end)))
        reader.start()
        wait_until(lambda: any(f"waiting up to 30s for a leader of {TOPIC}-{partition}" in r.getMessage()
                               for r in caplog.records), 30, "the read to wait for the leader")
        two_brokers.start_broker(1)
        reader.join(60)
        assert not reader.is_alive() and sum(len(buf) for _, buf in read) == end  # the whole range, once back

        two_brokers.brokers[1].stop()
        wait_until(lambda: 1 not in pool.metadata.brokers(), 30, "broker 1 to leave again")
        pool.leader_wait = 1
        with pytest.raises(ConnectionError, match=f"no leader of {TOPIC}-{partition} reachable within leader_wait 1s: "
                                                  f"leader broker 1 of {TOPIC}-{partition} is not live"):
            offsets.latest(pool, TOPIC, partition)
    finally:
        pool.close()
        pool.metadata.close()
