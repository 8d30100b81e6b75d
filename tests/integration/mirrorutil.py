"""What the mirror's tests share (tests/integration/test_mirror*.py): single- or
multi-broker clusters under their own chroots of one ZooKeeper, a producer thread
writing numbered values to a source, the `logbus mirror` command as a subprocess,
reading a topic back, and the check that a target holds every source message once,
in order per source partition."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from broker.client.consumer import SimpleConsumer
from broker.client.metadata import open_metadata
from broker.client.monitoring import MIRROR_TIER, read_events, sum_by_source
from broker.client.producer import Producer
from harness.cluster import LocalCluster
from harness.process import wait_until
from harness.zookeeper import with_chroot

LOGBUS = Path(sys.executable).parent / "logbus"
TOPIC = "events"
PARTITIONS = 2


def start_clusters(zk_connect: str, workdir: Path, brokers: dict[str, int],
                   settings: dict[str, dict[str, object]] | None = None) -> dict[str, tuple[str, LocalCluster]]:
    """{name: (connect string, LocalCluster)} with `brokers[name]` brokers each, fast
    flushes; `settings[name]` adds broker settings. On a failed start, what started is
    stopped."""
    out: dict[str, tuple[str, LocalCluster]] = {}
    try:
        for name, count in brokers.items():
            connect = with_chroot(zk_connect, f"/{name}")
            cluster = LocalCluster(connect, workdir / name,
                                   settings={"log.flush.interval.ms": 20, **(settings or {}).get(name, {})})
            out[name] = (connect, cluster)
            for broker_id in range(count):
                cluster.start_broker(broker_id)
    except BaseException:
        stop_clusters(out)
        raise
    return out


def stop_clusters(clusters: dict[str, tuple[str, LocalCluster]]) -> None:
    for _, cluster in clusters.values():
        for broker in cluster.brokers.values():
            if broker.alive:
                broker.resume()  # a paused broker would ignore SIGTERM until killed
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
        with Producer(zookeeper=self.connect, mode="async", acks=-1, monitoring=False, batch_size=20,
                      linger_ms=5) as producer:
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


def start_mirror(target: str, sources: dict[str, str], log: Path, *extra: str) -> subprocess.Popen:
    """`logbus mirror --name dc --topics events` from `sources` into `target`, its
    output appended to `log`."""
    args = [str(LOGBUS), "--zookeeper", target, "--log-level", "INFO", "mirror", "--name", "dc", "--topics", TOPIC,
            "--report-interval", "0", *extra]
    for name, connect in sources.items():
        args += ["--source", f"{name}={connect}"]
    env = {k: v for k, v in os.environ.items() if k != "LOGBUS_ZOOKEEPER"}
    return subprocess.Popen(args, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)


Sent = dict[str, dict[int, int]]  # source name -> partition -> values sent (numbered from 0)


def sent_by(producers: list[SourceProducer]) -> Sent:
    return {producer.name: dict(producer.sent) for producer in producers}


def wait_mirrored(target: str, sent: Sent, timeout: float = 120) -> None:
    """Wait until the target's partitions hold as many values as were sent."""

    def caught_up() -> bool:
        counts = {p: len(v) for p, v in read_topic(target, TOPIC, PARTITIONS).items()}
        return all(counts[p] >= sum(s.get(p, 0) for s in sent.values()) for p in range(PARTITIONS))

    wait_until(caught_up, timeout, "the mirror to catch up")


def assert_once_in_order(mirrored: dict[int, list[bytes]], sent: Sent) -> None:
    """Every `source:partition:seq` value sent in its partition of the target once, in order."""
    for partition in range(PARTITIONS):
        values = mirrored[partition]
        assert len(values) == len(set(values)), f"partition {partition}: duplicates"
        for name, counts in sent.items():
            prefix = b"%s:%d:" % (name.encode(), partition)
            seqs = [int(v[len(prefix):]) for v in values if v.startswith(prefix)]
            assert seqs == list(range(counts.get(partition, 0))), f"{name} partition {partition}"


def assert_counted_once(target: str, sent: Sent) -> None:
    """The mirror's monitoring events (tier "mirror") in the target count each message
    of each source once."""
    by_source = sum_by_source(read_events(target), MIRROR_TIER)
    for name, counts in sent.items():
        counted = sum(c.count for (topic, _), c in by_source.get(name, {}).items() if topic == TOPIC)
        assert counted == sum(counts.values()), name
