"""`logbus mirror` (docs/operations.md, "Mirroring"): two source clusters into one
target, exactly once — also when the mirror process is killed with SIGKILL at random
moments while producers write — and in order per source partition. Real ZooKeeper,
three single-broker clusters under their own chroots, the mirror as a subprocess."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from broker.client.metadata import open_metadata
from broker.client.consumer import SimpleConsumer
from broker.client.mirror import Mirror, MirrorSource
from broker.client.monitoring import MIRROR_TIER, read_events, sum_by_source
from broker.client.producer import Producer
from broker.common.zklayout import create_topic
from harness.cluster import LocalCluster
from harness.process import wait_until
from harness.zookeeper import client, with_chroot

LOGBUS = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "logbus"
TOPIC = "events"
PARTITIONS = 2


@pytest.fixture
def clusters(zk_connect, tmp_path):
    """{name: (connect string, LocalCluster)} for sources "east", "west" and the "offline" target."""
    out = {}
    try:
        for name in ("east", "west", "offline"):
            connect = with_chroot(zk_connect, f"/{name}")
            cluster = LocalCluster(connect, tmp_path / name, settings={"log.flush.interval.ms": 20})
            cluster.start_broker(0)
            out[name] = (connect, cluster)
        yield out
    finally:
        for _, cluster in out.values():
            cluster.stop()


def read_topic(connect: str, topic: str, partitions: int) -> dict[int, list[bytes]]:
    metadata = open_metadata(connect)
    try:
        out = {}
        for partition in range(partitions):
            with SimpleConsumer(topic, partition, metadata=metadata, offset="smallest", max_wait_ms=0) as consumer:
                end, values = consumer.latest(), []
                while consumer.offset < end:
                    values += [m.value for m in consumer.fetch()]
                out[partition] = values
        return out
    finally:
        metadata.close()


class SourceProducer(threading.Thread):
    """Writes `name:partition:seq` values to both partitions of a source until stopped."""

    def __init__(self, name: str, connect: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.name, self.connect, self.stop_event = name, connect, stop
        self.sent: dict[int, int] = defaultdict(int)

    def run(self) -> None:
        with Producer(zookeeper=self.connect, mode="async", acks=-1, monitoring=False, batch_size=20, linger_ms=5) as producer:
            while not self.stop_event.is_set():
                for partition in range(PARTITIONS):
                    futures = []
                    for _ in range(25):
                        seq = self.sent[partition]
                        futures.append(producer.send(TOPIC, b"%s:%d:%d" % (self.name.encode(), partition, seq),
                                                     partition=partition))
                        self.sent[partition] += 1
                    for future in futures:
                        future.result(60)
                time.sleep(0.02)


def start_mirror(target: str, sources: dict[str, str], log: Path) -> subprocess.Popen:
    args = [str(LOGBUS), "--zookeeper", target, "--log-level", "INFO", "mirror", "--name", "dc", "--topics", TOPIC,
            "--report-interval", "0"]
    for name, connect in sources.items():
        args += ["--source", f"{name}={connect}"]
    env = {k: v for k, v in os.environ.items() if k != "LOGBUS_ZOOKEEPER"}
    return subprocess.Popen(args, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)


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
    try:
        expected = {p: sum(producer.sent[p] for producer in producers) for p in range(PARTITIONS)}

        def caught_up() -> bool:
            counts = {p: len(v) for p, v in read_topic(target, TOPIC, PARTITIONS).items()}
            return all(counts[p] >= expected[p] for p in range(PARTITIONS))

        wait_until(caught_up, 120, "the mirror to catch up")
    finally:
        mirror.send_signal(signal.SIGTERM)
        assert mirror.wait(60) == 0, log.read_text()[-3000:]
    mirrored = read_topic(target, TOPIC, PARTITIONS)
    for partition in range(PARTITIONS):
        values = mirrored[partition]
        assert len(values) == len(set(values)), f"partition {partition}: duplicates"
        for producer in producers:
            prefix = b"%s:%d:" % (producer.name.encode(), partition)
            seqs = [int(v[len(prefix):]) for v in values if v.startswith(prefix)]
            assert seqs == list(range(producer.sent[partition])), f"{producer.name} partition {partition}"
    assert "mirror dc stopped" in log.read_text()
    # its monitoring events (tier "mirror") count each message once, across the ten kills
    by_source = sum_by_source(read_events(target), MIRROR_TIER)
    for producer in producers:
        counted = sum(c.count for (topic, _), c in by_source.get(producer.name, {}).items() if topic == TOPIC)
        assert counted == sum(producer.sent.values()), producer.name


def test_a_missing_target_topic_is_created_with_the_sources_partition_count_and_lag_is_reported(clusters):
    east, target = clusters["east"][0], clusters["offline"][0]
    with client(east) as zk:
        create_topic(zk, "clicks", 3)
    with Producer(zookeeper=east, monitoring=False) as producer:
        for i in range(30):
            producer.send("clicks", b"click %d" % i, key=b"user %d" % i)
    mirror = Mirror("lagging", [MirrorSource("east", zookeeper=east)], target, pattern="cl.*")
    stop = threading.Event()
    runner = threading.Thread(target=mirror.run, args=(stop,), daemon=True)
    try:
        runner.start()
        wait_until(lambda: sum(map(len, read_topic(target, "clicks", 3).values())) == 30 if mirror.target.partitions(
            "clicks") else False, 60, "30 messages mirrored")
        wait_until(lambda: set(mirror.lag().values()) == {0}, 30, "lag 0 on every partition")
        assert sorted(mirror.lag()) == [("east", "clicks", p) for p in range(3)]
        assert len(mirror.target.partitions("clicks")) == 3
    finally:
        stop.set()
        runner.join(30)
        mirror.close()
    source, mirrored = read_topic(east, "clicks", 3), read_topic(target, "clicks", 3)
    assert source == mirrored  # same partitions, same order


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
    mirror = Mirror("rekey", [MirrorSource("east", zookeeper=east)], target, topics=["views"], partitioning="key")
    stop = threading.Event()
    runner = threading.Thread(target=mirror.run, args=(stop,), daemon=True)
    try:
        runner.start()
        wait_until(lambda: sum(map(len, read_topic(target, "views", 2).values())) >= 63, 60, "63 messages mirrored")
    finally:
        stop.set()
        runner.join(30)
        mirror.close()
    mirrored = read_topic(target, "views", 2)
    assert sum(map(len, mirrored.values())) == 63
    for user in range(5):
        values = [b"k%d-%d" % (user, i) for i in range(user, 60, 5)]
        assert [v for v in mirrored[partition_for_key(b"user %d" % user, 2)] if v.startswith(b"k%d-" % user)] == values
    assert {v for p, vs in mirrored.items() for v in vs if v.startswith(b"unkeyed")} == {b"unkeyed 0", b"unkeyed 1",
                                                                                          b"unkeyed 2"}
    assert b"unkeyed 1" in mirrored[1] and b"unkeyed 2" in mirrored[0]
