"""The producer of two (or more) code trees against one broker, alternating, medians
(issue 38): what a client change is worth on a machine whose speed swings by half
within minutes.

    .venv/bin/python -m bench.producer_ab --arm /tmp/old:send --arm $PWD:produce \\
        --batch 50 --acks 0 --count 300000 --rounds 6

One ZooKeeper and one broker (this tree's) run for the whole comparison, so only the
producer differs. Each round runs every arm once, in a fresh process, the order
flipped every round: an arm is `TREE:CALL`, the producer of `TREE` (its directory on
PYTHONPATH; this file runs by its path, so a tree from before this file works) sending
`--count` messages of 200 bytes to one partition through `CALL` (`send` or `produce`),
then `flush`. Each run gives messages/s (first call to the end of `flush`) and the
producing process's CPU µs a message (user + system, every thread).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZE = 200
TOPIC = "ab"


def run_one(zookeeper: str, batch: int, count: int, acks: int, idempotent: bool, call: str) -> tuple[float, float]:
    """In the arm's process: one producer's (msg/s, CPU µs a message)."""
    from broker.client.producer import Producer  # the arm's tree's

    producer = Producer(zookeeper=zookeeper, mode="async", acks=acks, batch_size=batch, linger_ms=5,
                        monitoring=False, enable_idempotence=idempotent, queue_size=10_000)
    try:
        one = getattr(producer, call, None)
        if one is None:
            raise SystemExit(f"this tree's Producer has no {call}()")
        producer.send(TOPIC, b"warm", partition=0).result(60)  # topic and connection found before the clock
        value = b"x" * SIZE
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(count):
            one(TOPIC, value, partition=0)
        report = producer.flush(600)
        elapsed, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        if not report.ok:
            raise SystemExit(f"not all delivered: {report}")
    finally:
        producer.close(30)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return count / elapsed, cpu / count * 1e6


def compare(arms: list[tuple[str, str]], args: argparse.Namespace) -> dict[tuple[str, str], list[tuple[float, float]]]:
    from bench.clients import broker_knows
    from broker.common.zklayout import create_topic
    from harness.cluster import scratch_cluster
    from harness.process import wait_until
    from harness.zookeeper import client

    runs: dict[tuple[str, str], list[tuple[float, float]]] = {arm: [] for arm in arms}
    with scratch_cluster("logbus-bench-ab-") as (zookeeper, cluster):
        broker = cluster.start_broker(0, {"log.flush.interval.ms": 1000, "log.flush.interval.messages": 50_000,
                                          "log.retention.bytes": 1 << 30})
        with client(zookeeper.connect_string) as zk:
            create_topic(zk, TOPIC, 1)
        wait_until(lambda: broker_knows(broker.port, TOPIC, 1), 30, "the topic on the broker")
        for r in range(args.rounds):
            for tree, call in (arms if r % 2 == 0 else arms[::-1]):
                command = [sys.executable, str(Path(__file__).resolve()), "--one", zookeeper.connect_string,
                           "--batch", str(args.batch), "--count", str(args.count), "--acks", str(args.acks),
                           "--call", call] + (["--idempotent"] if args.idempotent else [])
                done = subprocess.run(command, cwd=tree, env={**os.environ, "PYTHONPATH": tree}, capture_output=True,
                                      text=True, timeout=900)
                if done.returncode != 0:
                    raise SystemExit(f"{tree} {call}: {done.stderr.strip()[-2000:]}")
                rate, cpu = map(float, done.stdout.split()[-2:])
                runs[(tree, call)].append((rate, cpu))
                print(f"round {r + 1} {tree} {call}: {rate:,.0f} msg/s, {cpu:.2f} CPU us/msg", flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", action="append", default=[], help="TREE:CALL (send or produce); two or more")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--acks", type=int, default=0)
    parser.add_argument("--idempotent", action="store_true")
    parser.add_argument("--count", type=int, default=300_000, help="messages per run")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--one", metavar="ZOOKEEPER", help=argparse.SUPPRESS)  # an arm's own run
    parser.add_argument("--call", default="send", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        rate, cpu = run_one(args.one, args.batch, args.count, args.acks, args.idempotent, args.call)
        print(f"{rate:.1f} {cpu:.3f}")
        return
    arms = []
    for arm in args.arm:
        tree, _, call = arm.rpartition(":")
        if not Path(tree, "broker").is_dir() or call not in ("send", "produce"):
            parser.error(f"--arm {arm!r}: want TREE:CALL, TREE a logbus checkout, CALL send or produce")
        arms.append((str(Path(tree).resolve()), call))
    if len(arms) < 2:
        parser.error("give two or more --arm TREE:CALL")
    runs = compare(arms, args)
    print(f"{args.count} messages of {SIZE} bytes per run, batch {args.batch}, acks {args.acks}"
          f"{', idempotent' if args.idempotent else ''}, {args.rounds} rounds alternating (medians)")
    for (tree, call), values in runs.items():
        rates, cpus = [v[0] for v in values], [v[1] for v in values]
        print(f"{tree} {call}: {statistics.median(rates):,.0f} msg/s, {statistics.median(cpus):.2f} CPU us/msg")


if __name__ == "__main__":
    main()
