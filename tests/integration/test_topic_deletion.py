"""Deleting a topic through the native listener (docs/protocol.md, DELETE_TOPIC) and
`logbus topics delete`: its data goes, a topic created again under the name starts
empty, bad input is refused with its reason, and a deletion under load ends writers
and readers of the topic with a clear error while other topics are served throughout."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from broker.client.consumer import SimpleConsumer
from broker.client.producer import Producer
from broker.common.errors import RequestTimedOut, TopicDeletionDisabled, UnknownTopic
from broker.common.zklayout import DELETE_TOPICS, offset_path, write_offset
from harness.process import wait_until
from tests.integration.brokerutil import connect, produce, read_partition, wait_flushed
from tests.integration.test_cli import assert_one_line_error, logbus


def partition_dirs(broker, topic: str) -> list[Path]:
    return sorted(Path(broker.log_dir).glob(f"{topic}-[0-9]*"))


@pytest.fixture
def broker(cluster):
    return cluster.start_broker(0, {"num.partitions": 2, "log.flush.interval.ms": 20})


def test_the_command_deletes_a_topic_and_a_new_one_of_its_name_starts_empty(broker, zk, zk_connect):
    producer = Producer(zookeeper=zk_connect, acks=-1, mode="sync", monitoring=False)
    try:
        old = [producer.send("orders", b"old-%d" % i, partition=i % 2).offset for i in range(40)]
        write_offset(zk, "readers", "orders", 0, old[-2] + 1)
        assert len(partition_dirs(broker, "orders")) == 2

        result = logbus(zk_connect, "topics", "delete", "orders")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "deleted topic orders"
        assert "orders" not in logbus(zk_connect, "topics", "list").stdout.split()
        assert partition_dirs(broker, "orders") == []
        assert zk.exists(offset_path("readers", "orders", 0)) is None
        with connect(broker) as conn:
            with pytest.raises(UnknownTopic):
                conn.fetch("orders", 0, 0, 1024)

        # the same idempotent producer (its id and sequences from before) writes the new topic
        new = [producer.send("orders", b"new-%d" % i, partition=0) for i in range(5)]
    finally:
        producer.close(30)
    assert new[0].offset == 0
    with connect(broker) as conn:
        wait_flushed(conn, "orders", 0, new[-1].offset + 1)
        assert [m.value for m in read_partition(conn, "orders", 0)] == [b"new-%d" % i for i in range(5)]


def test_bad_deletions_are_refused_with_their_reason_and_delete_nothing(broker, zk, zk_connect):
    with connect(broker) as conn:
        produce(conn, "kept", 0, [b"x"])
    assert_one_line_error(logbus(zk_connect, "topics", "delete"), "topics delete needs a NAME")
    assert_one_line_error(logbus(zk_connect, "topics", "delete", "no/slashes"), "invalid topic name")
    assert_one_line_error(logbus(zk_connect, "topics", "delete", "missing"), "unknown topic 'missing'")
    assert_one_line_error(logbus(zk_connect, "topics", "delete", "kept", "--timeout", "0"),
                          "--timeout must be more than 0 seconds")
    assert_one_line_error(logbus(zk_connect, "topics", "delete", "kept", "extra"), "at most one NAME")
    assert logbus(zk_connect, "topics", "list").stdout.split() == ["kept"]
    assert zk.get_children(DELETE_TOPICS) == []
    assert len(partition_dirs(broker, "kept")) == 2


def test_a_broker_with_deletion_disabled_refuses_it(cluster, zk):
    broker = cluster.start_broker(0, {"delete.topic.enable": "false"})
    with connect(broker) as conn:
        produce(conn, "kept", 0, [b"x"])
        with pytest.raises(TopicDeletionDisabled, match="delete.topic.enable is off"):
            conn.delete_topic("kept")
        with pytest.raises(UnknownTopic):
            conn.delete_topic("missing")
        assert [m.value for m in read_partition(conn, "kept", 0)] == [b"x"]
    assert zk.get_children(DELETE_TOPICS) == []


def test_a_deletion_not_complete_in_time_is_answered_timed_out_and_goes_on(cluster, zk):
    """The controller (the first broker registered) is paused, so no deletion is carried
    out: the request is answered REQUEST_TIMED_OUT at its timeout, the marker stays, and
    the deletion completes once the controller runs again."""
    holder = cluster.start_broker(1)
    wait_until(lambda: zk.exists("/controller") is not None, 30, "a controller")
    broker = cluster.start_broker(0)
    with connect(broker) as conn:
        conn.create_topic("slow", 1)
    holder.pause()
    try:
        with connect(broker) as conn:
            with pytest.raises(RequestTimedOut, match="marked for deletion"):
                conn.delete_topic("slow", 300)
    finally:
        holder.resume()
    wait_until(lambda: zk.exists("/brokers/topics/slow") is None and not zk.get_children(DELETE_TOPICS), 30,
               "the deletion to finish once the controller runs")


def test_a_deletion_under_load_ends_its_writers_and_readers_and_other_topics_are_served(cluster, zk, zk_connect):
    broker = cluster.start_broker(0, {"auto.create.topics": "false", "log.flush.interval.ms": 20})
    with connect(broker) as conn:
        conn.create_topic("doomed", 1)
        conn.create_topic("other", 1)
    errors: list[BaseException] = []
    stop = threading.Event()

    def write() -> None:
        with Producer(zookeeper=zk_connect, acks=1, mode="sync", monitoring=False, retries=3,
                      retry_backoff_ms=50, delivery_timeout_ms=20_000) as producer:
            while not stop.is_set():
                try:
                    producer.send("doomed", b"v", partition=0)
                except Exception as exc:
                    errors.append(exc)
                    return

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    wait_until(lambda: connect(broker).offsets("doomed", 0, -1)[0] > 0, 30, "the writer to write")
    served = []
    with SimpleConsumer("doomed", 0, zookeeper=zk_connect, offset=0, max_wait_ms=50,
                        retry_timeout_ms=2000) as consumer:
        assert consumer.fetch()  # reading it before the deletion
        with connect(broker) as conn:
            conn.delete_topic("doomed", 30_000)
            served.append(produce(conn, "other", 0, [b"o"]).base_offset)  # other topics are served
        writer.join(60)
        stop.set()
        assert not writer.is_alive(), "the writer hung on a deleted topic"
        assert errors and "TopicCreationDisabled: unknown topic 'doomed'" in str(errors[0]), errors
        with pytest.raises(UnknownTopic):
            for _ in range(1000):
                consumer.fetch()
    assert served == [0]


@pytest.mark.filterwarnings("ignore:No chroot path exists")  # the harness's client, on the new root
def test_a_broker_started_against_another_zookeeper_root_keeps_its_data(cluster, zk_connect):
    """Its topics are unknown there, but no deletion of their ids is recorded: the data
    stays on disk (unserved), and is served again once the broker is back on its root."""
    broker = cluster.start_broker(0, {"log.flush.interval.ms": 20})
    with connect(broker) as conn:
        conn.create_topic("kept", 1)
        produce(conn, "kept", 0, [b"precious"])
    broker.stop()
    broker.zookeeper = broker.broker_zookeeper = f"{zk_connect}_mistyped"
    cluster.start_broker(0)
    assert len(partition_dirs(broker, "kept")) == 1
    assert broker.logged_since(0, "no deletion of its topic id")
    broker.stop()
    broker.zookeeper = broker.broker_zookeeper = zk_connect
    cluster.start_broker(0)
    with connect(broker) as conn:
        assert [m.value for m in read_partition(conn, "kept", 0)] == [b"precious"]
