"""Mirror throughput and lag (not a test): `broker.client.mirror.Mirror` against a plain
consumer → producer loop of the client library (`SimpleConsumer` per partition, an
idempotent `Producer` to the same partition: at-least-once across crashes, the loop a
user would write), moving the same topic from a source cluster to a target cluster —
two single-broker clusters under their own ZooKeeper chroots on this machine.

    .venv/bin/python -m bench.mirror --messages 200000 --rounds 2

For 1 and 4 partitions, each round: `--messages` 200-byte messages produced into a new
source topic (batches of 50), then each mover, alternating, copies them into a fresh
target topic; msg/s is
messages over the time until the target acknowledged the last one. Then the mirror's
end-to-end lag: a producer sends 1,000 msg/s for 10 s with the mirror running and a
consumer on the target records now − message timestamp for each message.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time

from broker.client.metadata import open_metadata
from broker.client.consumer import SimpleConsumer
from broker.client.mirror import Mirror, MirrorSource
from broker.client.producer import Producer
from broker.common.message import now_ms
from broker.common.zklayout import create_topic
from harness.cluster import scratch_cluster
from harness.cluster import LocalCluster
from harness.zookeeper import client, with_chroot

SIZE = 200


def fill(source: str, topic: str, partitions: int, count: int) -> None:
    with client(source) as zk:
        create_topic(zk, topic, partitions)
    with Producer(zookeeper=source, mode="async", batch_size=50, monitoring=False) as producer:
        chunk = [b"m" * SIZE] * 1000
        for i in range(count // 1000):
            producer.send_many(topic, chunk, partition=i % partitions)
        assert producer.flush(300).ok
    while visible(source, topic, partitions) < count:  # acks=1: visible once the broker flushed
        time.sleep(0.1)


def visible(target: str, topic: str, partitions: int) -> int:
    metadata = open_metadata(target)
    try:
        total = 0
        for p in range(partitions):
            with SimpleConsumer(topic, p, metadata=metadata, offset="smallest", max_wait_ms=0) as consumer:
                end = consumer.latest()
                while consumer.offset < end:
                    total += len(consumer.fetch())
        return total
    finally:
        metadata.close()


def copy_times(sources: dict[str, str], target: str, topic: str, count: int, name: str,
               wait_for: set[str]) -> dict[str, float]:
    """Seconds from the mirror's start until the target acknowledged `count` messages
    of each source in `wait_for` (600 s at most)."""
    lock = threading.Lock()
    moved = {source: 0 for source in sources}
    finished: dict[str, float] = {}
    done = threading.Event()

    def mirrored(source: str, _topic: str, messages: list) -> None:  # in the partitions' threads
        with lock:
            moved[source] += len(messages)
            if moved[source] >= count and source not in finished:
                finished[source] = time.perf_counter() - start
                if wait_for <= set(finished):
                    done.set()

    mirror = Mirror(name, [MirrorSource(s, zookeeper=c) for s, c in sources.items()], target, topics=[topic],
                    on_mirrored=mirrored)
    stop = threading.Event()
    runner = threading.Thread(target=mirror.run, args=(stop,), daemon=True)
    start = time.perf_counter()
    runner.start()
    try:
        if not done.wait(600):
            raise SystemExit(f"the mirror moved {moved} messages of {count} a source in 600 s")
        return dict(finished)
    finally:
        stop.set()
        runner.join(60)
        mirror.close()


def run_mirror(source: str, target: str, topic: str, count: int, name: str) -> float:
    return count / copy_times({"src": source}, target, topic, count, name, {"src"})["src"]


def run_loop(source: str, target: str, topic: str, partitions: int, count: int, target_topic: str) -> float:
    """The plain loop: read each source partition, send every message to the target's
    partition of the same number, flush."""
    with client(target) as zk:
        create_topic(zk, target_topic, partitions)
    start = time.perf_counter()
    metadata = open_metadata(source)
    sent = 0
    try:
        with Producer(zookeeper=target, mode="async", batch_size=50, monitoring=False, acks=-1) as producer:
            for p in range(partitions):
                with SimpleConsumer(topic, p, metadata=metadata, offset="smallest", max_wait_ms=0) as consumer:
                    end = consumer.latest()
                    while consumer.offset < end:
                        for m in consumer.fetch():
                            producer.send(target_topic, m.value, key=m.key, timestamp=m.timestamp, partition=p)
                            sent += 1
            assert producer.flush(300).ok
    finally:
        metadata.close()
    if sent != count:
        raise SystemExit(f"the loop moved {sent} of {count} messages")
    return count / (time.perf_counter() - start)


def lag_samples(source: str, target: str, seconds: float = 10.0, rate: int = 1000) -> list[float]:
    topic = "bench-lag"
    with client(source) as zk:
        create_topic(zk, topic, 1)
    mirror = Mirror("lag", [MirrorSource("src", zookeeper=source)], target, topics=[topic], start="latest")
    stop = threading.Event()
    runner = threading.Thread(target=mirror.run, args=(stop,), daemon=True)
    runner.start()
    samples: list[float] = []
    metadata = open_metadata(target)
    try:
        while not mirror.target.partitions(topic) or not mirror.tasks:
            time.sleep(0.05)
        consumer = SimpleConsumer(topic, 0, metadata=metadata, offset="smallest", max_wait_ms=20)

        def read() -> None:
            while not stop.is_set():
                samples.extend(now_ms() - m.timestamp for m in consumer.fetch())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        with Producer(zookeeper=source, mode="async", linger_ms=0, monitoring=False) as producer:
            for _ in range(int(seconds * rate)):
                producer.send(topic, b"l" * SIZE, partition=0)
                time.sleep(1 / rate)
        time.sleep(2)
    finally:
        stop.set()
        runner.join(60)
        mirror.close()
        metadata.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rates: dict[tuple[int, str], list[float]] = {}
    with scratch_cluster("logbus-bench-mirror-") as (zookeeper, cluster):
        source, target = with_chroot(zookeeper.connect_string, "/source"), with_chroot(zookeeper.connect_string,
                                                                                      "/target")
        clusters = [LocalCluster(c, cluster.workdir / name, settings={"log.flush.interval.ms": 200})
                    for name, c in (("source", source), ("target", target))]
        try:
            for c in clusters:
                c.start_broker(0)
            for partitions in (1, 4):
                for round_ in range(args.rounds):
                    topic = f"bench-p{partitions}-r{round_}"  # each round's mirror writes a fresh target topic
                    fill(source, topic, partitions, args.messages)
                    order = ("mirror", "loop") if round_ % 2 == 0 else ("loop", "mirror")
                    for mover in order:
                        if mover == "mirror":
                            rate = run_mirror(source, target, topic, args.messages, f"bench-{partitions}-{round_}")
                        else:
                            rate = run_loop(source, target, topic, partitions, args.messages,
                                            f"loop-{partitions}-{round_}")
                        rates.setdefault((partitions, mover), []).append(rate)
            samples = sorted(lag_samples(source, target))
        finally:
            for c in clusters:
                c.stop()
    print(f"{args.messages} messages of {SIZE} bytes, {args.rounds} rounds, source and target: one broker each")
    for partitions in (1, 4):
        mirror = statistics.median(rates[(partitions, "mirror")])
        loop = statistics.median(rates[(partitions, "loop")])
        print(f"{partitions} partition(s): mirror {mirror:9.0f} msg/s   consumer->producer loop {loop:9.0f} msg/s   "
              f"ratio {mirror / loop:5.2f}")
    if samples:
        print(f"end-to-end lag through the mirror (1,000 msg/s for 10 s, {len(samples)} messages): "
              f"median {samples[len(samples) // 2]:.0f} ms, p99 {samples[int(len(samples) * 0.99)]:.0f} ms")


if __name__ == "__main__":
    main()
