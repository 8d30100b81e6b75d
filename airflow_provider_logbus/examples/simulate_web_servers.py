"""Simulate web servers emitting JSON activity events to logbus, with monitoring events on.

    python -m airflow_provider_logbus.examples.simulate_web_servers --zookeeper 127.0.0.1:2181/logbus \
        --topic web_activity --servers 3 --hours 3 --rate 200 [--seed 7]

(or `python simulate_web_servers.py ...` where the examples were copied). Each server is
one Producer (its own producer_id, so the audit sees each server's counts); events are
spread evenly over the last `--hours` hours (timestamps in the past, as replayed access
logs would be) plus `--tail-seconds` of events stamped "now".

Every run draws fresh events (a random `event_id` each, and fresh users, sessions,
pages): running it twice in the same hour sends twice as many distinct events, never
the same ones again. `--seed N` makes a run reproducible (the same seed sends the same
events: use it for tests, not to add data).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Callable, Iterator

from broker.client.producer import Producer

PAGES = ["/", "/search", "/product/{}", "/cart", "/checkout", "/login", "/help"]
ACTIONS = ["view", "click", "add_to_cart", "purchase", "search"]


def event(server: str, ts_ms: int, rng: random.Random) -> dict:
    return {
        "event_id": f"{rng.getrandbits(128):032x}", "server": server, "ts_ms": ts_ms,
        "user_id": rng.randrange(1, 50_000),
        "session": f"{rng.getrandbits(48):012x}", "action": rng.choice(ACTIONS),
        "page": rng.choice(PAGES).format(rng.randrange(1, 5000)), "status": rng.choice([200] * 19 + [500]),
        "latency_ms": round(rng.expovariate(1 / 80), 1),
    }


def server_events(server: int, start_ms: int, end_ms: int, per_server: int,
                  seed: int | None = None) -> Iterator[tuple[int, bytes, bytes]]:
    """(timestamp, key, value) of server number `server`'s events, evenly spread over
    [start_ms, end_ms): fresh ones every call without `seed`, the same ones with it."""
    name = f"web-{server + 1:02d}"
    rng = random.Random(None if seed is None else seed * 1000 + server)
    step = (end_ms - start_ms) / max(per_server, 1)
    for i in range(per_server):
        ts = int(start_ms + i * step)
        value = json.dumps(event(name, ts, rng)).encode()
        yield ts, str(rng.randrange(1000)).encode(), value


def simulate(zookeeper: str, topic: str, servers: int, start_ms: int, end_ms: int, per_server: int,
             seed: int | None = None, first_server: int = 0, request_timeout_ms: int = 30_000,
             midway: Callable[[], None] | None = None) -> dict[str, int]:
    """Send `per_server` events per server with timestamps evenly spread over [start_ms,
    end_ms); returns the count sent per server. Producers publish monitoring events.
    Without `seed` the events are fresh on every call (random event ids, drawn from the
    operating system's entropy); with a seed the same call sends the same events.
    Servers are numbered from `first_server` (web servers of several datacenters).
    `midway()` is called once, when the first server has delivered half its events and
    before it sends the rest (the demo stalls a broker there)."""
    sent = {}
    for s in range(first_server, first_server + servers):
        name = f"web-{s + 1:02d}"
        producer = Producer(zookeeper=zookeeper, acks=1, mode="async", monitoring=True, linger_ms=20, batch_size=500,
                            request_timeout_ms=request_timeout_ms, delivery_timeout_ms=120_000)
        try:
            reports = []
            for i, (ts, key, value) in enumerate(server_events(s, start_ms, end_ms, per_server, seed)):
                if midway is not None and s == first_server and i == per_server // 2:
                    reports.append(producer.flush())
                    midway()
                producer.send(topic, value, key=key, timestamp=ts)
            reports.append(producer.flush())
        finally:
            reports.append(producer.close())
        failed = [f for r in reports if r is not None for f in r.failed]
        if failed:
            raise RuntimeError(f"{name}: {len(failed)} sends failed: {failed[:3]}")
        sent[name] = per_server
    return sent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zookeeper", required=True)
    p.add_argument("--topic", default="web_activity")
    p.add_argument("--servers", type=int, default=3)
    p.add_argument("--hours", type=float, default=3)
    p.add_argument("--rate", type=int, default=200, help="events per server per hour")
    p.add_argument("--tail-seconds", type=int, default=60)
    p.add_argument("--seed", type=int, help="reproducible events (the same seed sends the same events again); "
                                             "by default every run sends fresh ones")
    args = p.parse_args(argv)
    now = int(time.time() * 1000)
    hour = 3_600_000
    start = now - now % hour - int(args.hours * hour)
    sent = simulate(args.zookeeper, args.topic, args.servers, start, now - now % hour, int(args.rate * args.hours),
                    seed=args.seed)
    simulate(args.zookeeper, args.topic, args.servers, now - args.tail_seconds * 1000, now, 10,
             seed=None if args.seed is None else args.seed + 1)
    print(json.dumps({"sent": sent, "from_ms": start, "to_ms": now}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
