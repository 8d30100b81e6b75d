"""What idempotence costs the producer (not a test): `Producer.send` of 200-byte
messages to one partition of one local broker, with `enable_idempotence` on and off,
at batch 1 and batch 50, acks 1 and -1, alternating on/off within each round so both
see the same machine.

    .venv/bin/python -m bench.idempotence --count 100000 --rounds 3

Prints the median msg/s of each setting and the ratio on/off (issue 23's goal: on
costs at most 5%).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from broker.client.producer import Producer
from broker.common.zklayout import create_topic
from harness.cluster import scratch_cluster
from harness.zookeeper import client

SIZE = 200


def produce(zk: str, topic: str, count: int, batch: int, acks: int, idempotent: bool) -> float:
    value = b"x" * SIZE
    with Producer(zookeeper=zk, mode="async", acks=acks, batch_size=batch, linger_ms=5, monitoring=False,
                  enable_idempotence=idempotent, queue_size=50_000) as producer:
        producer.send(topic, value, partition=0).result(30)  # the id and the topic are known before the clock
        start = time.perf_counter()
        for _ in range(count):
            producer.send(topic, value, partition=0)
        report = producer.flush(600)
        elapsed = time.perf_counter() - start
    assert report.ok, report
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    settings = [(batch, acks) for batch in (1, 50) for acks in (1, -1)]
    rates: dict[tuple[int, int, bool], list[float]] = {}
    with scratch_cluster("logbus-bench-idempotence-") as (zookeeper, cluster):
        cluster.start_broker(0, {"log.flush.interval.ms": 200, "log.flush.interval.messages": 100_000})
        with client(zookeeper.connect_string) as zk:
            for round_ in range(args.rounds):
                for batch, acks in settings:
                    for idempotent in ((False, True) if round_ % 2 == 0 else (True, False)):
                        topic = f"bench-r{round_}-b{batch}-a{acks}-{'on' if idempotent else 'off'}".replace("-1", "all")
                        create_topic(zk, topic, 1)
                        rate = produce(zookeeper.connect_string, topic, args.count, batch, acks, idempotent)
                        rates.setdefault((batch, acks, idempotent), []).append(rate)
    print(f"{args.count} messages of {SIZE} bytes per run, {args.rounds} rounds, one broker, one partition")
    print(f"{'setting':22} {'off msg/s':>10} {'on msg/s':>10} {'on/off':>7}")
    for batch, acks in settings:
        off = statistics.median(rates[(batch, acks, False)])
        on = statistics.median(rates[(batch, acks, True)])
        print(f"batch {batch:2}, acks {acks:2}       {off:10.0f} {on:10.0f} {on / off:7.3f}")


if __name__ == "__main__":
    main()
