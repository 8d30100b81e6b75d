"""The broker's registration and topic assignment in a real ZooKeeper (docs/zookeeper.md)."""

import json
import time

import pytest

from broker.common.errors import NotLeaderForPartition, TopicAlreadyExists
from broker.common.message import encode_message_set
from broker.common.zklayout import broker_path, decode_assignment, topic_path
from harness.process import wait_until

from .brokerutil import connect, produce, read_partition


def test_broker_node_appears_with_host_and_port(cluster, zk):
    broker = cluster.start_broker(4)
    data, stat = zk.get(broker_path(4))
    info = json.loads(data)
    assert (info["host"], info["port"]) == ("127.0.0.1", broker.port)
    assert "version" in info
    assert stat.ephemeralOwner != 0


def test_broker_node_vanishes_when_the_broker_dies(cluster, zk):
    broker = cluster.start_broker(0, {"zookeeper.session.timeout.ms": 2000})
    assert zk.exists(broker_path(0))
    broker.kill()
    wait_until(lambda: zk.exists(broker_path(0)) is None, 30, "the ephemeral node to expire")


def test_broker_node_vanishes_at_clean_shutdown(cluster, zk):
    broker = cluster.start_broker(0)
    assert broker.stop() == 0
    assert zk.exists(broker_path(0)) is None
    assert "stopped cleanly" in broker.log_tail()


def test_broker_registers_again_after_session_expiry(cluster, zk):
    broker = cluster.start_broker(0, {"zookeeper.session.timeout.ms": 2000})
    first_session = zk.get(broker_path(0))[1].ephemeralOwner
    broker.pause()  # frozen: no heartbeats, ZooKeeper expires the session
    try:
        wait_until(lambda: zk.exists(broker_path(0)) is None, 30, "the session to expire")
    finally:
        broker.resume()
    stat = wait_until(lambda: zk.exists(broker_path(0)), 30, "the broker to register again")
    assert stat.ephemeralOwner != first_session
    with connect(broker) as conn:  # and it still serves
        conn.create_topic("after", 1)
        produce(conn, "after", 0, [b"alive"])
        assert [m.value for m in read_partition(conn, "after", 0)] == [b"alive"]


def test_restarted_broker_waits_out_its_stale_registration(cluster, zk):
    broker = cluster.start_broker(0, {"zookeeper.session.timeout.ms": 2000})
    broker.kill()
    cluster.start_broker(0)  # old node may still be there; start must not fail
    assert zk.exists(broker_path(0))


def test_broker_paused_while_waiting_out_its_stale_registration_still_starts(cluster, zk):
    """A restarted broker frozen past its session timeout while it waits for its old
    node to expire: its ZooKeeper connection drops under the wait. It must retry and
    serve, not half-start (registered, with no event loop behind the port)."""
    broker = cluster.start_broker(0, {"zookeeper.session.timeout.ms": 2000})
    broker.kill()
    broker = cluster.start_broker(0, wait=False)
    wait_until(lambda: "waiting for the previous registration" in broker.log_tail(200), 30,
               "the broker to wait for its stale node")
    broker.pause()
    try:
        wait_until(lambda: zk.exists(broker_path(0)) is None, 30, "the stale node to expire")
        time.sleep(3)  # and this start's own session with it, while frozen
    finally:
        broker.resume()
    broker.wait_ready(60)
    assert broker.alive
    with connect(broker) as conn:
        conn.create_topic("restarted", 1)
        produce(conn, "restarted", 0, [b"alive"])
        assert [m.value for m in read_partition(conn, "restarted", 0)] == [b"alive"]


def test_topic_created_through_one_broker_spreads_over_both(cluster, zk):
    b0, b1 = cluster.start_broker(0), cluster.start_broker(1)
    with connect(b0) as conn:
        conn.create_topic("spread", 4)
    assignment = decode_assignment(zk.get(topic_path("spread"))[0])
    leaders = [assignment[p][0] for p in range(4)]
    assert sorted(leaders) == [0, 0, 1, 1]
    brokers = {0: b0, 1: b1}
    for partition, leader in enumerate(leaders):
        other = brokers[1 - leader]
        with connect(brokers[leader]) as owner, connect(other) as stranger:
            wait_until(lambda: _serves(owner, partition), 30, f"broker {leader} to serve spread-{partition}")
            with pytest.raises(NotLeaderForPartition, match=f"led by broker {leader}"):
                produce(stranger, "spread", partition, [b"no"])
            with pytest.raises(NotLeaderForPartition):
                stranger.fetch("spread", partition, 0)


def _serves(conn, partition):
    try:
        produce(conn, "spread", partition, [b"p%d" % partition])
        return True
    except NotLeaderForPartition:
        return False


def test_metadata_names_leaders_and_live_brokers(cluster):
    b0, b1 = cluster.start_broker(0), cluster.start_broker(1)
    with connect(b0) as conn:
        conn.create_topic("meta", 2)
        wait_until(lambda: len(conn.metadata().brokers) == 2, 30, "both brokers seen")
        meta = conn.metadata(["meta", "missing"])
        assert {b.broker_id: b.port for b in meta.brokers} == {0: b0.port, 1: b1.port}
        topic, missing = meta.topics
        assert sorted(p.leader for p in topic.partitions) == [0, 1]
        assert missing.error_code == 5 and missing.partitions == []
    b1.stop()
    with connect(b0) as conn:
        wait_until(lambda: len(conn.metadata().brokers) == 1, 30, "broker 1 gone")
        leaders = sorted(p.leader for p in conn.metadata(["meta"]).topics[0].partitions)
        assert leaders == [-1, 0]  # broker 1's partition is unavailable


def test_concurrent_creation_is_decided_by_zookeeper(cluster):
    b0, b1 = cluster.start_broker(0), cluster.start_broker(1)
    with connect(b0) as c0, connect(b1) as c1:
        c0.create_topic("once", 3)
        with pytest.raises(TopicAlreadyExists):
            c1.create_topic("once", 5)


def test_auto_created_topic_gets_num_partitions(cluster, zk):
    broker = cluster.start_broker(0, {"num.partitions": 3})
    with connect(broker) as conn:
        result = conn.produce("auto", -1, encode_message_set([(None, b"x", 1)]))
        assert result.base_offset == 0
    assert len(decode_assignment(zk.get(topic_path("auto"))[0])) == 3


def test_chroot_keeps_clusters_apart(cluster, zk, zookeeper):
    cluster.start_broker(0)
    assert zk.get_children("/brokers/ids") == ["0"]
    from kazoo.client import KazooClient

    root = KazooClient(zookeeper.connect_string)
    root.start(10)
    try:
        assert root.exists("/brokers/ids/0") is None  # every test's cluster lives in its own chroot
        assert root.exists(zk.chroot + "/brokers/ids/0")
    finally:
        root.stop()
        root.close()


def test_create_topic_with_auto_partitions_acts_like_a_first_produce(cluster, zk):
    broker = cluster.start_broker(0, {"num.partitions": 5})
    with connect(broker) as conn:
        conn.create_topic("defaults", -1)
        conn.create_topic("defaults", -1)  # an existing topic is success
    assert len(decode_assignment(zk.get(topic_path("defaults"))[0])) == 5


def test_create_topic_with_auto_partitions_obeys_auto_create_off(cluster):
    from broker.common.errors import UnknownTopic

    broker = cluster.start_broker(0, {"auto.create.topics": "false"})
    with connect(broker) as conn, pytest.raises(UnknownTopic, match="auto.create.topics is off"):
        conn.create_topic("refused", -1)


def test_losing_a_creation_race_adopts_the_winners_assignment(cluster, zk):
    from broker.common.protocol import BrokerInfo
    from broker.server.registration import BrokerRegistry
    from broker.common.zklayout import create_topic

    cluster.start_broker(0)
    winner = create_topic(zk, "raced", 3)
    seen = []
    registry = BrokerRegistry(zk, BrokerInfo(9, "127.0.0.1", 1), lambda t, a: seen.append((t, a)), 2000)
    # no watches started: only ensure_topic's own read can bring the assignment
    assert registry.ensure_topic("raced", 5) == winner
    assert registry.view.topics["raced"] == winner and seen == [("raced", winner)]


def test_a_client_goes_on_with_a_session_that_expired_as_it_connected(zk_connect, monkeypatch):
    """The client library's `connect_zookeeper` (the mirror's, the admin tool's, a
    ZooKeeper-metadata producer's) gave up with ZooKeeperUnavailable when its first
    session expired right after it was established (a process paused at that moment):
    it must go on with the session kazoo opens next."""
    from kazoo.client import KazooClient

    from broker.client.metadata import connect_zookeeper
    from tests.replication.faults import _expire_session_as_it_connects

    monkeypatch.setattr(KazooClient, "start_async", KazooClient.start_async)  # restored afterwards
    _expire_session_as_it_connects()
    client = connect_zookeeper(zk_connect, timeout=10, session_timeout=2)
    try:
        assert client.retry(client.exists, "/") is not None  # served by the next session
    finally:
        client.stop()
        client.close()
