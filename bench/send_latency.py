"""How long one async `send()` call takes at rates from 1% to 100% of the producer's
maximum — the Kafka 0.8 study's latency experiment, for our users' web servers, which
call `send` inside a request and must not stall on it (benchmark, not a test).

    .venv/bin/python -m bench.send_latency --seconds 5

First the maximum: one async producer sends `--count` messages as fast as it can
(the clock stops when `flush` returns). Then, for each fraction of that rate and each
fixed rate of `--rates` (2,000 and 20,000 msg/s: issue 38), the
producer sends paced messages for `--seconds` and the time of every `send` call is
taken with `perf_counter_ns`: mean, p99, p99.9 and max, beside the cyclic GC's
collections in that time and the longest of them (is a slow `send` the collector's?).
At 100% and above the queue
fills (`queue_size`) and `send` blocks until the sender makes room: that is
saturation, where the caller's time is the broker's pace.

After each fixed rate, a control row ("no-op"): the same paced loop calling a function
that does nothing, with no producer in the process. Its max is the machine's own stall
(the scheduler, other tenants, the hypervisor) that any call can meet, so a `send` max
near it says nothing about `send`.

The study saw 0.02 ms on average but 120 ms outliers at any rate. One broker, one
partition, 200-byte messages, acks=1, the producer's default batching (200 messages,
linger 5 ms), ZooKeeper and broker on the same machine.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable

from bench.clients import gc_clock
from broker.client.producer import Producer
from broker.common.zklayout import create_topic
from harness.cluster import scratch_cluster
from harness.zookeeper import client

SIZE = 200
FRACTIONS = (0.01, 0.1, 0.5, 0.9, 1.0)


def maximum_rate(zk: str, topic: str, count: int, acks: int) -> float:
    value = b"x" * SIZE
    with Producer(zookeeper=zk, mode="async", acks=acks, monitoring=False, enable_idempotence=acks != 0) as producer:
        start = time.perf_counter()
        for _ in range(count):
            producer.send(topic, value)
        report = producer.flush(300)
        elapsed = time.perf_counter() - start
    assert report.ok, report
    return count / elapsed


def paced_calls(call: Callable[[str, bytes], object], topic: str, rate: float,
                seconds: float) -> tuple[list[int], float, dict]:
    """Call `call(topic, value)` at `rate` a second for `seconds`; the duration of each
    call in ns, the rate reached, and the GC's work meanwhile (`gc_clock`)."""
    value = b"x" * SIZE
    count = max(1, int(rate * seconds))
    durations = [0] * count
    clock = time.perf_counter_ns
    interval = 1e9 / rate
    with gc_clock() as collected:
        start = clock()
        for i in range(count):
            due = start + i * interval
            ahead = due - clock()
            if ahead > 200_000:  # sleep when well ahead of schedule, else go on at once
                time.sleep(ahead / 1e9)
            before = clock()
            call(topic, value)
            durations[i] = clock() - before
        reached = count / ((clock() - start) / 1e9)
    return durations, reached, collected


def paced_sends(zk: str, topic: str, rate: float, seconds: float, acks: int) -> tuple[list[int], float, dict]:
    """`paced_calls` of a producer's `send`, which then delivers every message."""
    with Producer(zookeeper=zk, mode="async", acks=acks, monitoring=False, enable_idempotence=acks != 0) as producer:
        producer.send(topic, b"x" * SIZE)
        producer.flush(60)  # topic metadata and connection in place before the clock
        measured = paced_calls(producer.send, topic, rate, seconds)
        report = producer.flush(300)
    assert report.ok, report
    return measured


def nothing(topic: str, value: bytes) -> None:
    """The control's call: what the loop and the machine cost a call that does nothing."""


def summary(durations: list[int]) -> tuple[float, float, float, float]:
    """(mean, p99, p99.9, max) in ms."""
    ordered = sorted(durations)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] / 1e6

    return statistics.fmean(ordered) / 1e6, pct(0.99), pct(0.999), ordered[-1] / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="paced sending per rate (default 5)")
    parser.add_argument("--count", type=int, default=1_000_000,
                        help="messages for the maximum rate, long enough to fill the queue (default 1000000)")
    parser.add_argument("--acks", type=int, default=1)
    parser.add_argument("--rates", default="2000,20000",
                        help="fixed rates (msg/s) measured after the fractions (issue 38's goal: p99 <= 0.1 ms, "
                             "max <= 5 ms at 2,000 and 20,000)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with scratch_cluster("logbus-bench-latency-") as (zookeeper, cluster):
        cluster.start_broker(0, {"log.flush.interval.ms": 200, "log.flush.interval.messages": 100_000})
        with client(zookeeper.connect_string) as zk:
            create_topic(zk, "latency", 1)
        top = maximum_rate(zookeeper.connect_string, "latency", args.count, args.acks)
        rows = []
        targets = [(f"{f:7.0%}", f * top, False) for f in FRACTIONS]
        targets += [(f"{int(r):7d}", float(r), True) for r in args.rates.split(",") if r]
        for label, rate, fixed in targets:
            durations, reached, collected = paced_sends(zookeeper.connect_string, "latency", rate, args.seconds,
                                                        args.acks)
            rows.append((label, reached, len(durations), *summary(durations), sum(collected["runs"]),
                         collected["longest"] * 1e3))
            if fixed:  # the control right after, in the same minute
                durations, reached, collected = paced_calls(nothing, "latency", rate, args.seconds)
                rows.append((f"{label} no-op", reached, len(durations), *summary(durations),
                             sum(collected["runs"]), collected["longest"] * 1e3))
    print(f"async send() latency, {SIZE}-byte messages, acks={args.acks}, maximum {top:,.0f} msg/s")
    print(f"{'target':>13} {'msg/s':>9} {'sends':>8} {'mean ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} {'max ms':>8} "
          f"{'GCs':>5} {'longest GC ms':>13}")
    for label, reached, n, mean, p99, p999, worst, collections, longest in rows:
        print(f"{label:>13} {reached:9,.0f} {n:8d} {mean:8.4f} {p99:8.3f} {p999:9.3f} {worst:8.2f} {collections:5d} "
              f"{longest:13.2f}")


if __name__ == "__main__":
    main()
