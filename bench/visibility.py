"""When a replicated message becomes visible (not a test): end-to-end latency, send to
a consumer's fetch, on three brokers, replication factor 3, at a fixed rate, under
each `replica.visibility` — `all-flushed` (the rule before issue 25: the high
watermark waits for the leader's own flush too, so acks=1 messages wait for the
200 ms flush interval) and `followers-flushed` (the default: every in-sync follower's
flushed end and the leader's log end) — one fresh cluster per run, the two rules
alternating round by round.

    .venv/bin/python -m bench.visibility --rate 2000 --seconds 5 --rounds 2

Prints p50/p99/max per rule and acks (issue 25's goal: p99 <= 10 ms at 2,000 msg/s,
RF 3, acks 1 and -1).
"""

from __future__ import annotations

import argparse
import logging
import statistics

from bench.replication import BROKER_SETTINGS, Bench
from harness.cluster import scratch_cluster

RULES = ("all-flushed", "followers-flushed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: dict[tuple[str, int], list[dict]] = {}
    for round_ in range(args.rounds):
        for rule in (RULES if round_ % 2 == 0 else tuple(reversed(RULES))):
            with scratch_cluster("logbus-bench-visibility-", {**BROKER_SETTINGS, "replica.visibility": rule}) as (
                    _, cluster):
                cluster.start(3)
                bench = Bench(cluster)
                for acks in (1, -1):
                    summary = bench.latency(3, acks, args.rate, args.seconds)
                    results.setdefault((rule, acks), []).append(summary)
                    print(f"round {round_ + 1} {rule:17} acks={acks:2d}: p50 {summary['p50']:7.1f} ms  "
                          f"p99 {summary['p99']:7.1f} ms  max {summary['max']:7.1f} ms  "
                          f"({summary['received']}/{summary['sent']} received)", flush=True)
    print(f"\nRF 3, {args.rate:.0f} msg/s of 200 bytes for {args.seconds:g} s, median over {args.rounds} rounds (ms):")
    print(f"{'rule':17} {'acks':>4} {'p50':>7} {'p99':>7} {'max':>7}")
    for (rule, acks), runs in results.items():
        print(f"{rule:17} {acks:4d} " + " ".join(f"{statistics.median(r[k] for r in runs):7.1f}"
                                                  for k in ("p50", "p99", "max")))


if __name__ == "__main__":
    main()
