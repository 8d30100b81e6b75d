"""`logbus perf produce|consume`: throughput and latency, like Kafka's perf tools.

While running, a progress line goes to stderr every `--report-interval` seconds; at the
end one summary line goes to stdout: records, records/s, MB/s, and latency
percentiles (produce: from `send` to the broker's answer — with acks=0 to the socket
write; consume: from the message timestamp to its arrival, end to end).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from broker.common.protocol import check_topic_name


class Stats:
    """Counts, bytes and latencies (ms) of a run; `report` prints a progress line."""

    def __init__(self, interval: float) -> None:
        self.start = time.monotonic()
        self.count = 0
        self.bytes = 0
        self.latencies: list[float] = []
        self.interval = interval
        self._next = self.start + interval
        self._window_count = 0
        self._window_start = self.start

    def add(self, count: int, size: int, latencies: list[float] = ()) -> None:
        self.count += count
        self.bytes += size
        self.latencies.extend(latencies)
        now = time.monotonic()
        if now >= self._next:
            rate = (self.count - self._window_count) / max(now - self._window_start, 1e-9)
            print(f"{self.count} records, {rate:.0f} records/s", file=sys.stderr, flush=True)
            self._window_count, self._window_start, self._next = self.count, now, now + self.interval

    def summary(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        line = (f"{self.count} records, {self.count / elapsed:.1f} records/s, "
                f"{self.bytes / elapsed / 1e6:.2f} MB/s, {elapsed:.2f} s")
        if self.latencies:
            lat = sorted(self.latencies)

            def pct(q: float) -> float:
                return lat[min(len(lat) - 1, int(q * len(lat)))]

            line += (f", latency avg {sum(lat) / len(lat):.1f} ms, max {lat[-1]:.1f} ms, p50 {pct(0.5):.1f} ms, "
                     f"p95 {pct(0.95):.1f} ms, p99 {pct(0.99):.1f} ms, p99.9 {pct(0.999):.1f} ms")
        return line


def perf_produce(args: argparse.Namespace, cluster) -> int:
    from broker.client.producer import Producer

    check_topic_name(args.topic)
    stats = Stats(args.report_interval)

    def delivered(batch) -> None:  # a DeliveredBatch; latency measured from its first message
        stats.add(batch.count, batch.bytes, [(time.monotonic() - batch.created) * 1000] * batch.count)

    producer = Producer(metadata=cluster.metadata, acks=args.acks, compression=args.compression, mode=args.mode,
                        batch_size=args.batch_size, linger_ms=args.linger_ms, on_delivery=delivered, monitoring=False,
                        enable_idempotence=args.acks != 0)
    value = os.urandom(args.size // 2 + 1).hex()[: args.size].encode()
    try:
        for _ in range(args.count):
            producer.send(args.topic, value)
    finally:
        report = producer.close(args.timeout)
    print(stats.summary())
    if report.failed:
        print(f"logbus: {len(report.failed)} records failed: {report.failed[0].error}", file=sys.stderr)
        return 1
    return 0


def perf_consume(args: argparse.Namespace, cluster) -> int:
    from broker.client.consumer import SimpleConsumer

    leaders = cluster.leaders(args.topic)
    consumers = [SimpleConsumer(args.topic, p, metadata=cluster.metadata, offset="smallest", max_wait_ms=100,
                                fetch_size=args.fetch_size) for p in sorted(leaders)]
    stats = Stats(args.report_interval)
    idle_since = time.monotonic()
    try:
        while stats.count < args.count:
            got = 0
            for consumer in consumers:
                batch = consumer.fetch()
                if batch:
                    now_ms = time.time() * 1000
                    stats.add(len(batch), sum(len(m.value) for m in batch), [now_ms - m.timestamp for m in batch])
                    got += len(batch)
            if got:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > args.idle_timeout:
                break
    finally:
        for consumer in consumers:
            consumer.close()
    print(stats.summary())
    return 0 if stats.count >= args.count else 1


def add_perf_parser(sub, common: argparse.ArgumentParser) -> None:
    perf = sub.add_parser("perf", parents=[common], help="measure produce or consume throughput")
    kinds = perf.add_subparsers(dest="kind", required=True)
    p = kinds.add_parser("produce", parents=[common])
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--size", type=int, default=200, help="bytes per message value")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--linger-ms", type=int, default=5)
    p.add_argument("--acks", type=int, choices=[0, 1, -1], default=1)
    p.add_argument("--compression", default="none")
    p.add_argument("--mode", choices=["sync", "async"], default="async")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--report-interval", type=float, default=2.0)
    p.set_defaults(run=perf_produce)
    p = kinds.add_parser("consume", parents=[common])
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--fetch-size", type=int, default=1 << 20)
    p.add_argument("--idle-timeout", type=float, default=10.0)
    p.add_argument("--report-interval", type=float, default=2.0)
    p.set_defaults(run=perf_consume)
