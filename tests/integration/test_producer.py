"""The producer against real brokers: partitioning, auto-creation, failover, async
delivery and its reports."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from broker.client.metadata import open_metadata
from broker.client.errors import ProduceError
from broker.client.partitioner import partition_for_key
from broker.client.producer import Producer
from broker.common.errors import ErrorCode, MessageTooLarge, TopicCreationDisabled, UnknownTopic
from broker.common.zklayout import create_topic
from harness.process import wait_until
from tests.integration.clientutil import read_topic, wait_visible

KEYS = [f"user-{i}" for i in range(40)]
SECOND_PRODUCER = """
import json, sys
from broker.client.producer import Producer
with Producer(zookeeper=sys.argv[1], monitoring=False) as p:
    print(json.dumps({k: p.send(sys.argv[2], b"v", key=k).partition for k in sys.argv[3:]}))
"""


def test_keyed_sends_land_on_the_same_partition_from_every_process(cluster, zk, zk_connect):
    cluster.start_broker(0)
    cluster.start_broker(1)
    create_topic(zk, "keyed", 6)
    with Producer(zookeeper=zk_connect, monitoring=False) as producer:
        here = {k: producer.send("keyed", b"v", key=k).partition for k in KEYS}
    child = subprocess.run([sys.executable, "-c", SECOND_PRODUCER, zk_connect, "keyed", *KEYS],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == here
    assert len(set(here.values())) > 1


def test_unkeyed_sends_spread_over_all_partitions(cluster, zk, zk_connect):
    cluster.start_broker(0)
    cluster.start_broker(1)
    create_topic(zk, "spread", 4)
    with Producer(zookeeper=zk_connect, monitoring=False) as producer:
        partitions = {producer.send("spread", b"v%d" % i).partition for i in range(80)}
    assert partitions == {0, 1, 2, 3}


def test_unkeyed_sends_skip_the_partitions_of_a_broker_that_is_down(cluster, zk, zk_connect):
    cluster.start_broker(0)
    down = cluster.start_broker(1)
    assignment = create_topic(zk, "skip", 4)
    alive = {p for p, replicas in assignment.items() if replicas[0] == 0}
    with Producer(zookeeper=zk_connect, monitoring=False) as producer:
        down.stop()
        wait_until(lambda: 1 not in producer.metadata.brokers(), 30, "broker 1 to leave the registry")
        partitions = {producer.send("skip", b"v%d" % i).partition for i in range(40)}
    assert partitions == alive


def test_sending_to_an_unknown_topic_creates_it_with_the_broker_default(cluster, zk_connect):
    cluster.start_broker(0, {"num.partitions": 3})
    with Producer(zookeeper=zk_connect, monitoring=False) as producer:
        result = producer.send("fresh", b"hello")
    metadata = open_metadata(zk_connect)
    try:
        assert sorted(metadata.partitions("fresh")) == [0, 1, 2]
    finally:
        metadata.close()
    assert result.offset == 0


def test_sync_send_returns_the_offset_of_each_message(cluster, zk, zk_connect):
    cluster.start_broker(0)
    create_topic(zk, "offsets", 1)
    with Producer(zookeeper=zk_connect, monitoring=False) as producer:
        results = [producer.send("offsets", b"x" * n, partition=0) for n in (1, 10, 100)]
    messages = wait_visible(zk_connect, "offsets", 3)[0]
    assert [r.offset for r in results] == [m.offset for m in messages]


def test_send_to_a_missing_explicit_partition_fails(cluster, zk, zk_connect):
    cluster.start_broker(0)
    create_topic(zk, "two", 2)
    with Producer(zookeeper=zk_connect, monitoring=False) as producer:
        with pytest.raises(ProduceError, match="no partition 5"):
            producer.send("two", b"v", partition=5)


def test_producer_with_a_static_broker_list_finds_the_leaders(cluster, zk, zk_connect):
    first = cluster.start_broker(0)
    cluster.start_broker(1)
    create_topic(zk, "static", 4)
    with Producer(brokers=[f"127.0.0.1:{first.port}"], monitoring=False) as producer:
        partitions = {producer.send("static", b"v", partition=p).partition for p in range(4)}
    assert partitions == {0, 1, 2, 3}
    assert sum(map(len, wait_visible(zk_connect, "static", 4).values())) == 4


def test_async_producer_delivers_every_message_in_batches(cluster, zk, zk_connect):
    cluster.start_broker(0)
    cluster.start_broker(1)
    create_topic(zk, "bulk", 4)
    producer = Producer(zookeeper=zk_connect, mode="async", batch_size=50, monitoring=False)
    for i in range(2000):
        producer.send("bulk", b"%d" % i, key=b"%d" % (i % 10))
    report = producer.close(30)
    assert (report.delivered, report.failed) == (2000, [])
    values = [m.value for ms in wait_visible(zk_connect, "bulk", 2000).values() for m in ms]
    assert sorted(values) == sorted(b"%d" % i for i in range(2000))


def test_async_producer_keeps_the_order_of_a_key(cluster, zk, zk_connect):
    cluster.start_broker(0)
    create_topic(zk, "ordered", 3)
    producer = Producer(zookeeper=zk_connect, mode="async", batch_size=7, monitoring=False)
    for i in range(300):
        producer.send("ordered", b"%d" % i, key=b"same")
    assert producer.close(30).ok
    partition = [ms for ms in wait_visible(zk_connect, "ordered", 300).values() if ms][0]
    assert [int(m.value) for m in partition] == list(range(300))


def test_async_close_returns_while_all_brokers_are_down_and_reports_what_it_could_not_send(cluster, zk, zk_connect):
    broker = cluster.start_broker(0)
    create_topic(zk, "doomed", 2)
    producer = Producer(zookeeper=zk_connect, mode="async", monitoring=False)
    producer.send("doomed", b"before")
    assert producer.flush(30).delivered == 1
    broker.stop()
    wait_until(lambda: not producer.metadata.brokers(), 30, "the broker to leave the registry")
    for i in range(100):
        producer.send("doomed", b"after %d" % i)
    report = producer.close(timeout=2)
    assert report.delivered == 0
    assert len(report.failed) == 100
    assert {f.value for f in report.failed} == {b"after %d" % i for i in range(100)}


def test_gzip_batches_are_read_back_whole(cluster, zk, zk_connect):
    cluster.start_broker(0)
    create_topic(zk, "zipped", 1)
    producer = Producer(zookeeper=zk_connect, mode="async", compression="gzip", batch_size=25, monitoring=False)
    for i in range(100):
        producer.send("zipped", b"line %d" % i)
    assert producer.close(30).ok
    assert [m.value for m in wait_visible(zk_connect, "zipped", 100)[0]] == [b"line %d" % i for i in range(100)]


def test_flush_reports_a_failure_for_a_topic_that_cannot_be_created(cluster, zk_connect):
    cluster.start_broker(0, {"auto.create.topics": "false"})
    producer = Producer(zookeeper=zk_connect, mode="async", monitoring=False)
    producer.send("nowhere", b"v")
    report = producer.flush(10)
    producer.close(5)
    assert [type(f.error).__name__ for f in report.failed] == ["TopicCreationDisabled"]
    assert isinstance(report.failed[0].error, UnknownTopic)
    assert read_topic(zk_connect, "nowhere") == {}


def test_sync_send_raises_the_broker_error_by_its_code(cluster, zk, zk_connect):
    cluster.start_broker(0, {"message.max.bytes": 1024})
    create_topic(zk, "small", 1)
    with Producer(zookeeper=zk_connect, monitoring=False) as producer:
        with pytest.raises(ProduceError, match="MessageTooLarge") as raised:
            producer.send("small", b"x" * 4096, partition=0)
        assert type(raised.value.cause) is MessageTooLarge
        assert raised.value.cause.code == ErrorCode.MESSAGE_TOO_LARGE
        assert producer.send("small", b"fits", partition=0).offset == 0  # one refused message spoils nothing


def test_an_unknown_topic_with_auto_create_off_fails_at_once_with_its_own_error(cluster, zk_connect):
    cluster.start_broker(0, {"auto.create.topics": "false"})
    # a delivery timeout far beyond the test's: only a failure by code can end these sends
    with Producer(zookeeper=zk_connect, monitoring=False, delivery_timeout_ms=3_600_000, max_block_ms=3_600_000) as sync:
        with pytest.raises(ProduceError, match="auto.create.topics is off") as raised:
            sync.send("nowhere", b"v")
        assert type(raised.value.cause) is TopicCreationDisabled
    producer = Producer(zookeeper=zk_connect, mode="async", monitoring=False, delivery_timeout_ms=3_600_000,
                        max_block_ms=3_600_000)
    future = producer.send("nowhere", b"v")
    assert isinstance(future.exception(60), TopicCreationDisabled)
    with pytest.raises(ProduceError):
        producer.send_many("nowhere", [b"a", b"b"]).result(60)
    report = producer.close(10)
    assert [f.value for f in report.failed] == [b"v", b"a", b"b"]


def test_futures_resolve_after_the_broker_restarts(cluster, zk, zk_connect):
    broker = cluster.start_broker(0)
    create_topic(zk, "restarted", 2)
    producer = Producer(zookeeper=zk_connect, mode="async", acks=1, monitoring=False, retries=1000,
                        retry_backoff_ms=50, delivery_timeout_ms=120_000)
    try:
        before = [producer.send("restarted", b"before %d" % i, key=b"%d" % i) for i in range(20)]
        assert all(f.result(60).offset >= 0 for f in before)
        broker.stop()  # sends fail (connection refused) and retry until it is back, registered or not
        during = [producer.send("restarted", b"during %d" % i, key=b"%d" % i) for i in range(20)]
        many = producer.send_many("restarted", [b"many %d" % i for i in range(30)])
        assert not any(f.done() for f in during)
        broker.start()
        landed = [f.result(60) for f in during]
        assert many.result(60) == 30
        assert producer.flush(60).ok
    finally:
        producer.close(10)
    assert {m.partition for m in landed} <= {0, 1}
    values = {m.value for ms in wait_visible(zk_connect, "restarted", 70).values() for m in ms}
    assert {b"during %d" % i for i in range(20)} | {b"many %d" % i for i in range(30)} <= values
    by_offset = {(p, m.offset): m.value for p, ms in wait_visible(zk_connect, "restarted", 70).items() for m in ms}
    assert len(by_offset) == 70, "every record has an offset of its own"
    assert [by_offset[(m.partition, m.offset)] for m in landed] == [b"during %d" % i for i in range(20)]


def test_send_many_to_a_partition_or_under_a_key(cluster, zk, zk_connect):
    cluster.start_broker(0)
    create_topic(zk, "grouped", 4)
    with Producer(zookeeper=zk_connect, acks=1, monitoring=False) as producer:
        assert producer.send_many("grouped", [b"p3 %d" % i for i in range(10)], partition=3) == 10
        assert producer.send_many("grouped", [b"user %d" % i for i in range(10)], key="user-42") == 10
        with pytest.raises(ProduceError, match="no partition 9"):
            producer.send_many("grouped", [b"nowhere"], partition=9)
    keyed = partition_for_key(b"user-42", 4)
    visible = wait_visible(zk_connect, "grouped", 20)
    assert [m.value for m in visible[3] if m.value.startswith(b"p3")] == [b"p3 %d" % i for i in range(10)]
    assert [(m.key, m.value) for m in visible[keyed] if m.value.startswith(b"user")] == \
        [(b"user-42", b"user %d" % i) for i in range(10)]


@pytest.mark.parametrize("acks", [0, 1, -1])
@pytest.mark.parametrize("batch_size", [1, 50])
def test_on_delivery_is_called_once_per_batch_before_flush_returns(cluster, zk_connect, acks, batch_size):
    """flush() returns only once every delivered batch's callback has run, once, with
    counts that add up to its report. A slow callback (as a benchmark's counting or a
    user's bookkeeping may be) makes the old order — release, then callbacks — fail:
    the last round's callbacks ran after flush had returned (issue 25: 998,819 of
    1,000,000 counted by `make bench`)."""
    cluster.start_broker(0)
    calls: list[tuple[int, int, int]] = []

    def on_delivery(batch) -> None:
        time.sleep(0.002)
        calls.append((batch.partition, batch.base_offset, batch.count))

    with Producer(zookeeper=zk_connect, acks=acks, mode="async", batch_size=batch_size, monitoring=False,
                  on_delivery=on_delivery, enable_idempotence=acks != 0) as producer:
        for i in range(500):
            producer.send("callbacks", b"value %d" % i, partition=0)
        report = producer.flush(60)
        counted = sum(count for _, _, count in calls)
    assert report.ok and report.delivered == 500
    assert counted == 500
    if acks != 0:  # each batch once: its own offsets, no two alike
        assert len({(p, offset) for p, offset, _ in calls}) == len(calls)


@pytest.mark.parametrize("idempotent", [True, False])
@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_a_batch_that_compresses_below_its_message_count_goes_uncompressed(cluster, zk, zk_connect, codec,
                                                                           idempotent):
    """3,000 empty messages in one batch compress to fewer bytes than messages, which
    the broker refuses (a record's offset is its entry's position plus its index:
    docs/architecture.md, "Offsets"). The producer sends that batch uncompressed, with
    the same identity: all delivered once, read back with 3,000 distinct offsets."""
    cluster.start_broker(0)
    create_topic(zk, "empties", 1)
    count = 3000
    with Producer(zookeeper=zk_connect, mode="async", compression=codec, batch_size=count, linger_ms=60_000,
                  delivery_timeout_ms=120_000, monitoring=False, enable_idempotence=idempotent) as producer:
        futures = [producer.send("empties", b"", partition=0, timestamp=1) for _ in range(count)]
        report = producer.flush(60)
        offsets = [f.result(10).offset for f in futures]
    assert (report.delivered, report.failed, report.pending) == (count, [], 0)
    read = wait_visible(zk_connect, "empties", count)[0]
    assert [m.value for m in read] == [b""] * count
    assert len({m.offset for m in read}) == count
    if not idempotent:  # sent as plain entries: each future has its message's own offset
        assert offsets == [m.offset for m in read]
