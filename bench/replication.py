"""What replication costs the producer — the Kafka 0.8 producer study's experiments on
three local brokers (benchmark, not a test):

- throughput for replication factor 1, 2, 3 × acks 1 and -1, with 200-byte and
  1 KB messages (`matrix`);
- throughput against the number of partitions, 1 to 16 (`partitions`);
- end-to-end latency, send to a consumer's fetch, at a fixed rate for each
  replication factor (`latency`).

    PYTHONPATH=$PWD .venv/bin/python -m bench.replication --out /tmp/bench-replication

Three brokers and one ZooKeeper server on this machine's two cores, the load generator
on the same cores: the brokers' followers compete with the producer, so RF 3 here
costs CPU the study's three machines spread out. Each measurement is one async
producer (default batching) sending `--count` messages as fast as it can; the clock
stops when `flush` returns, i.e. when the last message is acknowledged. Results go
to `<out>/replication.json` and the plots to `bench/plots/replication-*.png` (`--plots
DIR`, or `none` for no plots).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import threading
import time
from pathlib import Path

from broker.client.connection import BrokerConnection
from broker.client.consumer import SimpleConsumer
from broker.client.producer import Producer
from harness.cluster import LocalCluster, scratch_cluster

PLOTS = Path(__file__).parent / "plots"
SIZES = (200, 1024)
FACTORS = (1, 2, 3)
ACKS = (1, -1)
PARTITION_COUNTS = (1, 2, 4, 8, 16)
BROKER_SETTINGS = {"log.flush.interval.ms": 200, "log.flush.interval.messages": 10_000}
# Our unreplicated producer (BENCHMARKS.md, issue 10: bench.clients, one broker, one
# partition, 200-byte messages, batch 50, acks=1), drawn beside the replicated figures.
UNREPLICATED = (355_311, "one broker, no replication (issue 10, acks=1)")


class Bench:
    """One cluster of three brokers; a fresh topic for every measurement."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.topics = 0

    def topic(self, partitions: int, replication_factor: int) -> str:
        self.topics += 1
        name = f"bench-{self.topics}-p{partitions}-rf{replication_factor}"
        with BrokerConnection(*self.cluster.brokers[0].address) as connection:
            connection.create_topic(name, partitions, replication_factor)
        with Producer(zookeeper=self.cluster.zookeeper, acks=-1, monitoring=False, retries=50) as producer:
            for partition in range(partitions):  # leaders elected and followers caught up
                producer.send(name, b"warm-up", partition=partition)
        return name

    def throughput(self, partitions: int, replication_factor: int, acks: int, size: int, count: int) -> float:
        topic = self.topic(partitions, replication_factor)
        value = b"x" * size
        with Producer(zookeeper=self.cluster.zookeeper, mode="async", acks=acks, monitoring=False, enable_idempotence=acks != 0) as producer:
            start = time.perf_counter()
            for _ in range(count):
                producer.send(topic, value)
            report = producer.flush(600)
            elapsed = time.perf_counter() - start
        assert report.ok, report
        return count / elapsed

    def latency(self, replication_factor: int, acks: int, rate: float, seconds: float) -> dict[str, float]:
        """Paced sends of `time_ns` stamps; a consumer thread fetches them (up to the
        high watermark) and notes when each arrives. Milliseconds."""
        topic = self.topic(1, replication_factor)
        stop = threading.Event()
        delays: list[float] = []

        def consume() -> None:
            with SimpleConsumer(topic, 0, zookeeper=self.cluster.zookeeper, offset="largest",
                                max_wait_ms=100) as consumer:
                ready.set()
                while not stop.is_set():
                    for message in consumer.fetch():
                        delays.append((time.time_ns() - int(message.value[:19])) / 1e6)

        ready = threading.Event()
        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        count = int(rate * seconds)
        try:  # the reader stops also on failure, closing its consumer (and its ZooKeeper watches)
            ready.wait(30)
            with Producer(zookeeper=self.cluster.zookeeper, mode="async", acks=acks, monitoring=False, enable_idempotence=acks != 0,
                          linger_ms=0) as producer:
                start = time.perf_counter()
                for i in range(count):
                    ahead = start + i / rate - time.perf_counter()
                    if ahead > 0:
                        time.sleep(ahead)
                    producer.send(topic, b"%019d" % time.time_ns() + b"x" * 181)
                producer.flush(60)
            deadline = time.monotonic() + 30
            while len(delays) < count and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            reader.join(10)
        ordered = sorted(delays)
        return {"received": len(ordered), "sent": count, "p50": ordered[len(ordered) // 2],
                "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], "max": ordered[-1],
                "mean": statistics.fmean(ordered)}


def run(out: Path, count_200: int, count_1k: int, partition_count: int, partition_counts: tuple[int, ...],
        rate: float, seconds: float) -> dict:
    results: dict = {"matrix": [], "partitions": [], "latency": [], "settings": BROKER_SETTINGS}
    with scratch_cluster("logbus-bench-replication-", BROKER_SETTINGS) as (zookeeper, cluster):
        cluster.start(3)
        bench = Bench(cluster)
        for size in SIZES:
            for factor in FACTORS:
                for acks in ACKS:
                    measured = bench.throughput(3, factor, acks, size, count_200 if size == 200 else count_1k)
                    results["matrix"].append({"size": size, "rf": factor, "acks": acks, "msg_per_s": measured})
                    print(f"{size:5d} B rf={factor} acks={acks:2d}: {measured:10,.0f} msg/s", flush=True)
        for factor in (1, 3):
            for partitions in partition_counts:
                measured = bench.throughput(partitions, factor, -1, 200, partition_count)
                results["partitions"].append({"partitions": partitions, "rf": factor, "acks": -1,
                                              "msg_per_s": measured})
                print(f"{partitions:2d} partitions rf={factor} acks=-1: {measured:10,.0f} msg/s", flush=True)
        for factor in FACTORS:
            for acks in ACKS:
                summary = bench.latency(factor, acks, rate, seconds)
                results["latency"].append({"rf": factor, "acks": acks, "rate": rate, **summary})
                print(f"latency rf={factor} acks={acks:2d} at {rate:.0f} msg/s: p50 {summary['p50']:.1f} ms, "
                      f"p99 {summary['p99']:.1f} ms, max {summary['max']:.1f} ms", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replication.json").write_text(json.dumps(results, indent=1))
    return results


def _label(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot(results: dict, plots: Path = PLOTS) -> None:
    import matplotlib  # noqa: PLC0415 - optional dependency of the bench extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
    for ax, size in zip(axes, SIZES):
        for acks, style in zip(ACKS, ("o-", "s--")):
            rows = [r for r in results["matrix"] if r["size"] == size and r["acks"] == acks]
            ax.plot([r["rf"] for r in rows], [r["msg_per_s"] for r in rows], style, label=f"acks={acks}")
        if size == 200:
            ax.axhline(UNREPLICATED[0], color="gray", linestyle=":", label=UNREPLICATED[1])
        ax.set_xticks(FACTORS)
        _label(ax, f"{size}-byte messages, 3 partitions", "replication factor", "messages/s")
    fig.suptitle("Producer throughput against replication factor (3 local brokers)")
    fig.tight_layout()
    fig.savefig(plots / "replication-throughput.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.5), dpi=110)
    for factor, style in zip((1, 3), ("o-", "s--")):
        rows = [r for r in results["partitions"] if r["rf"] == factor]
        ax.plot([r["partitions"] for r in rows], [r["msg_per_s"] for r in rows], style,
                label=f"replication factor {factor}, acks=-1")
    ax.set_xscale("log", base=2)
    counts = sorted({r["partitions"] for r in results["partitions"]})
    ax.set_xticks(counts, [str(p) for p in counts])
    _label(ax, "Producer throughput against partitions (3 brokers)", "partitions", "messages/s (200 bytes)")
    fig.tight_layout()
    fig.savefig(plots / "replication-partitions.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.5), dpi=110)
    for acks, offset in zip(ACKS, (-0.15, 0.15)):
        rows = [r for r in results["latency"] if r["acks"] == acks]
        xs = [r["rf"] + offset for r in rows]
        ax.bar(xs, [r["p50"] for r in rows], width=0.3, label=f"p50, acks={acks}")
        ax.scatter(xs, [r["p99"] for r in rows], marker="_", s=300, color="black")
    ax.set_xticks(FACTORS)
    ax.set_xlabel("replication factor (bars p50, dashes p99)")
    ax.set_ylabel("send → consumer (ms)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    rate = results["latency"][0]["rate"] if results["latency"] else 0
    ax.set_title(f"End-to-end latency at {rate:.0f} msg/s")
    fig.tight_layout()
    fig.savefig(plots / "replication-latency.png")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-replication"))
    parser.add_argument("--count", type=int, default=100_000, help="200-byte messages per throughput run")
    parser.add_argument("--count-1k", type=int, default=40_000, help="1 KB messages per throughput run")
    parser.add_argument("--partition-count", type=int, default=60_000, help="messages per partitions run")
    parser.add_argument("--rate", type=float, default=1000, help="messages/s of the latency runs")
    parser.add_argument("--seconds", type=float, default=5, help="length of each latency run")
    parser.add_argument("--partition-counts", default=",".join(map(str, PARTITION_COUNTS)),
                        help="partition counts of the partitions runs (default 1,2,4,8,16)")
    parser.add_argument("--plots", default=str(PLOTS),
                        help="where the figures go (default bench/plots; none: no figures, no matplotlib needed)")
    parser.add_argument("--plot-only", action="store_true", help="redraw from <out>/replication.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.plot_only:
        results = json.loads((args.out / "replication.json").read_text())
    else:
        counts = tuple(int(c) for c in args.partition_counts.split(","))
        results = run(args.out, args.count, args.count_1k, args.partition_count, counts, args.rate, args.seconds)
    if args.plots != "none":
        plot(results, Path(args.plots))


if __name__ == "__main__":
    main()
