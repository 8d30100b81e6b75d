"""`logbus mirror` (docs/operations.md, "Mirroring"): two source clusters into one
target, exactly once — also when the mirror process is killed with SIGKILL at random
moments while producers write — and in order per source partition. Real ZooKeeper,
three single-broker clusters under their own chroots, the mirror as a subprocess."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from broker.client.cluster import ConnectionPool
from broker.client.metadata import open_metadata
from broker.client.mirror import Mirror, MirrorSource
from broker.client.offsets import group_offsets
from broker.client.producer import Producer
from broker.common.zklayout import create_topic, offsets_path
from harness.process import wait_until
from harness.zookeeper import client
from tests.integration.clientutil import entry_count, produce_batch_and_gzip_set, wait_visible
from tests.integration.mirrorutil import (
    LOGBUS, PARTITIONS, TOPIC, SourceProducer, assert_counted_once, assert_once_in_order, read_topic,
    sent_by, start_clusters, start_mirror, stop_clusters, wait_mirrored,
)


@pytest.fixture
def clusters(zk_connect, tmp_path):
    """{name: (connect string, LocalCluster)} for sources "east", "west" and the "offline" target."""
    out = start_clusters(zk_connect, tmp_path, {"east": 1, "west": 1, "offline": 1})
    yield out
    stop_clusters(out)


@contextmanager
def running(mirror: Mirror) -> Iterator[Mirror]:
    """`mirror` runs in a thread of this process for the block; stopped and closed after."""
    stop = threading.Event()
    runner = threading.Thread(target=mirror.run, args=(stop,), daemon=True)
    runner.start()
    try:
        yield mirror
    finally:
        stop.set()
        runner.join(30)
        mirror.close()


def test_two_sources_into_one_target_exactly_once_across_ten_kills_of_the_mirror(clusters, tmp_path):
    sources = {name: clusters[name][0] for name in ("east", "west")}
    target = clusters["offline"][0]
    for connect in sources.values():
        with client(connect) as zk:
            create_topic(zk, TOPIC, PARTITIONS)
    stop = threading.Event()
    producers = [SourceProducer(name, connect, stop) for name, connect in sources.items()]
    for producer in producers:
        producer.start()
    log = tmp_path / "mirror.log"
    rng = random.Random(23)
    try:
        for _ in range(10):
            mirror = start_mirror(target, sources, log)
            time.sleep(rng.uniform(0.5, 3.0))  # killed at a random moment: starting, mid-write, mid-checkpoint
            mirror.send_signal(signal.SIGKILL)
            mirror.wait(30)
        mirror = start_mirror(target, sources, log)
        time.sleep(2)
    finally:
        stop.set()
        for producer in producers:
            producer.join(120)
    sent = sent_by(producers)
    try:
        wait_mirrored(target, sent)
    finally:
        mirror.send_signal(signal.SIGTERM)
        assert mirror.wait(60) == 0, log.read_text()[-3000:]
    assert_once_in_order(read_topic(target, TOPIC, PARTITIONS), sent)
    assert "mirror dc stopped" in log.read_text()
    assert_counted_once(target, sent)  # tier "mirror": each message once, across the ten kills


def test_a_missing_target_topic_is_created_with_the_sources_partition_count_and_lag_is_reported(clusters):
    east, target = clusters["east"][0], clusters["offline"][0]
    with client(east) as zk:
        create_topic(zk, "clicks", 3)
    with Producer(zookeeper=east, monitoring=False) as producer:
        for i in range(30):
            producer.send("clicks", b"click %d" % i, key=b"user %d" % i)
    with running(Mirror("lagging", [MirrorSource("east", zookeeper=east)], target, pattern="cl.*")) as mirror:
        wait_until(lambda: sum(map(len, read_topic(target, "clicks", 3).values())) == 30 if mirror.target.partitions(
            "clicks") else False, 60, "30 messages mirrored")
        wait_until(lambda: set(mirror.lag().values()) == {0}, 30, "lag 0 on every partition")
        assert sorted(mirror.lag()) == [("east", "clicks", p) for p in range(3)]
        assert len(mirror.target.partitions("clicks")) == 3
    source, mirrored = read_topic(east, "clicks", 3), read_topic(target, "clicks", 3)
    assert source == mirrored  # same partitions, same order


def test_a_restarted_mirror_commits_its_group_offsets_though_nothing_new_arrives(clusters):
    """A mirror killed between writing its checkpoint in the target and committing the
    same offsets to the source's group left the group behind; restarted, it resumed
    from the checkpoint and, with nothing new to copy, never committed: lag tools (and
    the demo) saw the partition lag forever (seen in CI: "32 records from None")."""
    east, target = clusters["east"][0], clusters["offline"][0]
    with client(east) as zk:
        create_topic(zk, "quiet", 1)
        with Producer(zookeeper=east, monitoring=False) as producer:
            for i in range(10):
                producer.send("quiet", b"event %d" % i, partition=0)
        with running(Mirror("quiet", [MirrorSource("east", zookeeper=east)], target, pattern="quiet")) as mirror:
            wait_until(lambda: set(mirror.lag().values()) == {0}, 60, "the mirror to catch up")
            wait_until(lambda: group_offsets(zk, "mirror-quiet", "quiet", [0]), 30, "the group's offset")
        end = group_offsets(zk, "mirror-quiet", "quiet", [0])
        zk.delete(offsets_path("mirror-quiet"), recursive=True)  # the commit a kill -9 cut off
        with running(Mirror("quiet", [MirrorSource("east", zookeeper=east)], target, pattern="quiet")):
            wait_until(lambda: group_offsets(zk, "mirror-quiet", "quiet", [0]) == end, 30,
                       "the restarted mirror to commit the offset it resumed from")


def test_bad_mirror_arguments_are_one_line_errors(clusters):
    target = clusters["offline"][0]
    result = subprocess.run([str(LOGBUS), "--zookeeper", target, "mirror", "--name", "x", "--source", "nowhere",
                             "--topics", "t"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "NAME=ZOOKEEPER" in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(ValueError, match="distinct names"):
        Mirror("x", [MirrorSource("a", zookeeper=target), MirrorSource("a", zookeeper=target)], target, topics=["t"])


def test_key_partitioning_into_a_target_with_another_partition_count(clusters):
    """`partitioning="key"`: a keyed message goes to its key's partition of the target
    (whose count differs from the source's), an unkeyed one to the source partition
    modulo the target's count; each once, and a key's messages in their source order."""
    from broker.client.partitioner import partition_for_key

    east, target = clusters["east"][0], clusters["offline"][0]
    with client(east) as zk:
        create_topic(zk, "views", 3)
    with client(target) as zk:
        create_topic(zk, "views", 2)
    with Producer(zookeeper=east, monitoring=False) as producer:
        for i in range(60):
            producer.send("views", b"k%d-%d" % (i % 5, i), key=b"user %d" % (i % 5))
        for partition in range(3):
            producer.send("views", b"unkeyed %d" % partition, partition=partition)
    with running(Mirror("rekey", [MirrorSource("east", zookeeper=east)], target, topics=["views"],
                        partitioning="key")):
        wait_until(lambda: sum(map(len, read_topic(target, "views", 2).values())) >= 63, 60, "63 messages mirrored")
    mirrored = read_topic(target, "views", 2)
    assert sum(map(len, mirrored.values())) == 63
    for user in range(5):
        values = [b"k%d-%d" % (user, i) for i in range(user, 60, 5)]
        assert [v for v in mirrored[partition_for_key(b"user %d" % user, 2)] if v.startswith(b"k%d-" % user)] == values
    assert {v for p, vs in mirrored.items() for v in vs if v.startswith(b"unkeyed")} == {b"unkeyed 0", b"unkeyed 1",
                                                                                          b"unkeyed 2"}
    assert b"unkeyed 1" in mirrored[1] and b"unkeyed 2" in mirrored[0]


@contextmanager
def connection_pool(connect: str) -> Iterator[ConnectionPool]:
    metadata = open_metadata(connect)
    pool = ConnectionPool(metadata, "test", 10)
    try:
        yield pool
    finally:
        pool.close()
        metadata.close()


def test_a_checkpoint_at_a_record_inside_a_source_entry_resumes_at_the_next_record(clusters):
    """Source offsets are per record (docs/architecture.md, "Offsets"), so a checkpoint
    may name a record inside a batch: the mirror copies exactly the records from there
    on, each once, writes each source entry as one target batch (not one per record),
    and checkpoints the end of what it copied."""
    from broker.client.consumer import SimpleConsumer
    from broker.client.mirror_partition import Checkpoint, SourceLag
    from broker.common.zklayout import mirror_checkpoint_path

    east, target = clusters["east"][0], clusters["offline"][0]
    with client(east) as zk:
        create_topic(zk, "moves", 1)
    produce_batch_and_gzip_set(east, "moves")
    source = wait_visible(east, "moves", 20)[0]
    assert entry_count(source) == 2
    with connection_pool(east) as pool:  # the lag the mirror will report: records, counted by the source's leader
        lag = SourceLag(pool, "moves", 0)
        lag.update(source[4].offset, source[-1].next_offset)
        assert lag.records == 16 != source[-1].next_offset - source[4].offset
        lag.update(source[-1].next_offset)
        assert lag.records == 0
    with connection_pool(target) as pool:
        producer_id = pool.any().init_producer_id().producer_id
    path = mirror_checkpoint_path("midway", "east", "moves", 0)
    with client(target) as zk:
        zk.create(path, Checkpoint(producer_id, source[4].offset).encode(), makepath=True)
    with running(Mirror("midway", [MirrorSource("east", zookeeper=east)], target, topics=["moves"],
                        monitoring=False)) as mirror:
        wait_until(lambda: mirror.target.partitions("moves") and len(read_topic(target, "moves", 1)[0]) >= 16, 60,
                   "16 records mirrored")
        wait_until(lambda: set(mirror.lag().values()) == {0}, 30, "lag 0")
    with SimpleConsumer("moves", 0, zookeeper=target, offset="smallest", max_wait_ms=0) as consumer:
        mirrored = list(consumer)
    assert [m.value for m in mirrored] == [m.value for m in source[4:]]
    assert entry_count(mirrored) == 2, "one target batch per source entry"
    with client(target) as zk:
        assert Checkpoint.decode(zk.get(path)[0]).source_offset == source[-1].next_offset
