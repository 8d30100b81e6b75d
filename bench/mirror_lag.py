"""The mirror's end-to-end lag and its throughput with one source stopped (not a test;
issue 33).

    .venv/bin/python -m bench.mirror_lag --rate 2000 --seconds 10 --flush-ms 200,20,5 --linger-ms 5,0 \\
        --messages 100000

Lag: for each `--flush-ms` and `--linger-ms`, a fresh source and target cluster (one broker each, under
their own ZooKeeper chroots) with that `log.flush.interval.ms` — consumers see flushed
data only on both sides (docs/storage.md), and the target flushes at once for the
mirror's acks=-1 writes — and `logbus mirror` as its own process, as operators run it.
A producer sends `--rate` 200-byte messages a second (acks 1, each `--linger-ms`) into
one source partition for `--seconds` s, each stamped with `time.time_ns()` at send,
once a first message has gone through (the mirror has started); a consumer of the
source and one of the target (long polls) take now − stamp for each. Prints p50 and
p99 at the source, and p50, p99 and max through the mirror, in ms per setting.

Throughput: sources "east" and "west" each hold `--messages` 200-byte messages in 2
partitions; a `Mirror` copies both into the target, once with both sources up, once
with east's broker stopped (SIGSTOP) before it starts. Prints west's msg/s (its
messages over the time until the target acknowledged its last) in both, and both
sources' together while both are up.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.mirror import copy_times, fill
from broker.client.consumer import SimpleConsumer
from broker.client.producer import Producer
from broker.common.zklayout import create_topic
from harness.cluster import LocalCluster, scratch_cluster
from harness.process import stop_process
from harness.zookeeper import client, with_chroot

SIZE = 200
STAMP = 19  # digits of time.time_ns()


def mirror_command(target: str, source: str, topic: str) -> list[str]:
    """`logbus mirror` from the running environment (the venv's script beside python)."""
    script = Path(sys.executable).parent / "logbus"
    start = [str(script)] if script.exists() else [
        sys.executable, "-c", "from broker.tools.cli import main; raise SystemExit(main())"]
    return start + ["--zookeeper", target, "mirror", "--name", "lag", "--source", f"src={source}", "--topics", topic,
                    "--report-interval", "0"]


class Stamps(threading.Thread):
    """Reads a partition from its end (long polls) and keeps (sent, ms after sending)
    for each stamped message, until `stop`."""

    def __init__(self, zookeeper: str, topic: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.zookeeper, self.topic, self.stop = zookeeper, topic, stop
        self.seen: list[tuple[float, float]] = []
        self.ready = threading.Event()

    def run(self) -> None:
        with SimpleConsumer(self.topic, 0, zookeeper=self.zookeeper, offset="largest", max_wait_ms=100) as consumer:
            self.ready.set()
            while not self.stop.is_set():
                for message in consumer.fetch():
                    sent = int(message.value[:STAMP])
                    self.seen.append((sent / 1e9, (time.time_ns() - sent) / 1e6))

    def since(self, first: float) -> list[float]:
        """The delays of messages sent at or after `first` (time.time()), sorted."""
        return sorted(ms for sent, ms in self.seen if sent >= first)


def lag_run(root: str, workdir: Path, flush_ms: int, linger_ms: int, rate: float,
            seconds: float) -> tuple[list[float], list[float]]:
    """Milliseconds from send to a consumer of the source and to one of the target,
    for each message (sorted)."""
    topic, run = "bench-lag", f"{flush_ms}-{linger_ms}"
    source, target = with_chroot(root, f"/source-{run}"), with_chroot(root, f"/target-{run}")
    clusters = [LocalCluster(c, workdir / f"{name}-{run}", settings={"log.flush.interval.ms": flush_ms})
                for name, c in (("source", source), ("target", target))]
    mirror = None
    stop = threading.Event()
    try:
        for cluster in clusters:
            cluster.start_broker(0)
        for connect in (source, target):
            with client(connect) as zk:
                create_topic(zk, topic, 1)
        mirror = subprocess.Popen(mirror_command(target, source, topic), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        readers = [Stamps(source, topic, stop), Stamps(target, topic, stop)]
        for reader in readers:
            reader.start()
            reader.ready.wait(30)
        count = int(rate * seconds)
        with Producer(zookeeper=source, mode="async", acks=1, linger_ms=linger_ms, monitoring=False) as producer:
            deadline = time.monotonic() + 60
            while not readers[1].seen:  # the mirror copies: it has started
                if time.monotonic() > deadline:
                    raise SystemExit("the mirror copied nothing within 60 s")
                producer.send(topic, b"%019d" % time.time_ns(), partition=0)
                time.sleep(0.2)
            start, first = time.perf_counter(), time.time()
            for i in range(count):
                ahead = start + i / rate - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
                producer.send(topic, b"%019d" % time.time_ns() + b"x" * (SIZE - STAMP), partition=0)
            producer.flush(60)
        deadline = time.monotonic() + 30
        while min(len(r.since(first)) for r in readers) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        got = [len(r.since(first)) for r in readers]
        if min(got) < count:
            raise SystemExit(f"flush {flush_ms} ms, linger {linger_ms} ms: of {count} messages the source's consumer "
                             f"read {got[0]}, the target's {got[1]}")
        return readers[0].since(first), readers[1].since(first)
    finally:
        stop.set()
        if mirror is not None:
            stop_process(mirror, signal.SIGTERM, 30)
        for cluster in clusters:
            cluster.stop()


def throughput(root: str, workdir: Path, count: int) -> dict[str, dict[str, float]]:
    """{"both up" | "east stopped": {source: msg/s}} (west's, and both's while both are up)."""
    connects = {name: with_chroot(root, f"/{name}") for name in ("east", "west", "target")}
    clusters = {name: LocalCluster(c, workdir / name, settings={"log.flush.interval.ms": 200})
                for name, c in connects.items()}
    sources = {name: connects[name] for name in ("east", "west")}
    rates: dict[str, dict[str, float]] = {}
    try:
        for cluster in clusters.values():
            cluster.start_broker(0)
        for run, topic in (("both up", "bench-both"), ("east stopped", "bench-stopped")):
            for connect in sources.values():
                fill(connect, topic, 2, count)
            east = clusters["east"].brokers[0]
            if run == "east stopped":
                east.pause()
            try:
                wait_for = {"west"} if run == "east stopped" else {"east", "west"}
                times = copy_times(sources, connects["target"], topic, count, topic, wait_for)
            finally:
                east.resume()
            rates[run] = {"west": count / times["west"]}
            if run == "both up":
                rates[run]["both"] = 2 * count / max(times.values())
    finally:
        for cluster in clusters.values():
            cluster.stop()
    return rates


def percentile(ordered: list[float], share: float) -> float:
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000, help="messages a second for the lag (default 2000)")
    parser.add_argument("--seconds", type=float, default=10, help="seconds of sending per flush setting")
    parser.add_argument("--flush-ms", default="200,20,5",
                        help="log.flush.interval.ms of both clusters, one lag run each (comma-separated)")
    parser.add_argument("--linger-ms", default="5,0",
                        help="the source producer's linger_ms, one lag run each (comma-separated; 5 is its default)")
    parser.add_argument("--messages", type=int, default=100_000, help="messages a source for the throughput")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    flushes = [int(f) for f in args.flush_ms.split(",") if f.strip()]
    lingers = [int(f) for f in args.linger_ms.split(",") if f.strip()]
    with scratch_cluster("logbus-bench-mirror-lag-") as (zookeeper, cluster):
        root = zookeeper.connect_string
        print(f"end-to-end lag, {args.rate:.0f} msg/s of {SIZE} bytes for {args.seconds:g} s, one broker a side, "
              "ms from send to a consumer of the source / of the target through the mirror:", flush=True)
        print(f"{'flush.ms':>8} {'linger':>6} {'messages':>8} {'src p50':>7} {'src p99':>7} {'p50':>7} {'p99':>7} "
              f"{'max':>7}", flush=True)
        for flush_ms in flushes:
            for linger_ms in lingers:
                at_source, at_target = lag_run(root, cluster.workdir / "lag", flush_ms, linger_ms, args.rate,
                                               args.seconds)
                print(f"{flush_ms:8d} {linger_ms:6d} {len(at_target):8d} {percentile(at_source, 0.5):7.1f} "
                      f"{percentile(at_source, 0.99):7.1f} {percentile(at_target, 0.5):7.1f} "
                      f"{percentile(at_target, 0.99):7.1f} {at_target[-1]:7.1f}", flush=True)
        rates = throughput(with_chroot(root, "/throughput"), cluster.workdir / "throughput", args.messages)
    print(f"mirror throughput, 2 sources x 2 partitions x {args.messages} messages of {SIZE} bytes:")
    print(f"both sources up          west {rates['both up']['west']:9.0f} msg/s   both {rates['both up']['both']:9.0f} msg/s")
    print(f"east stopped (SIGSTOP)   west {rates['east stopped']['west']:9.0f} msg/s")


if __name__ == "__main__":
    main()
