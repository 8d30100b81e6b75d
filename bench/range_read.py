"""Range-read benchmark (not a test): the provider's `LogbusCluster.read_range` over
1,000,000 messages of one partition, timed, with the ZooKeeper requests it makes.

    PYTHONPATH=$PWD .venv/bin/python -m bench.range_read --code before=/tmp/base-client --code after=$PWD

One ZooKeeper server and one broker (from the running tree) hold the data; each
`--code NAME=DIR` reads the whole range in a child process whose PYTHONPATH is DIR, so
two versions of the provider are compared on the same data in one run. The child
counts requests at kazoo's single request path (`KazooClient._call`; pings are not
requests) and reports them by type. Only `LogbusCluster(zookeeper)`, `read_range` and
`latest` are used: the facade both versions have.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

TOPIC = "range-read"
SIZE = 200  # value bytes, as bench/clients.py
ENTRY = SIZE + 22


# ------------------------------------------------------------------ child: one read


def read(zookeeper: str, end: int, fetch_bytes: int) -> dict:
    """Read [0, end) of partition 0 once; time it and count ZooKeeper requests."""
    from kazoo.client import KazooClient

    requests: Counter[str] = Counter()
    call = KazooClient._call

    def counted(self, request, async_object):
        requests[type(request).__name__] += 1
        return call(self, request, async_object)

    KazooClient._call = counted
    from airflow_provider_logbus.cluster import LogbusCluster

    start = time.perf_counter()
    read_bytes = sets = 0
    with LogbusCluster(zookeeper) as cluster:
        for _, buf in cluster.read_range(TOPIC, 0, 0, end, fetch_bytes):
            read_bytes += len(buf)
            sets += 1
    seconds = time.perf_counter() - start
    if read_bytes != end:
        raise SystemExit(f"read {read_bytes} bytes of {end}")
    return {"seconds": seconds, "fetches": sets, "zk_requests": sum(requests.values()), "by_type": dict(requests)}


# ------------------------------------------------------------- parent: data, runs


def produce(zookeeper: str, count: int) -> int:
    """`count` messages into partition 0; the flushed end offset once all are visible."""
    from airflow_provider_logbus.cluster import LogbusCluster
    from broker.client.producer import Producer

    value = b"x" * SIZE
    with Producer(zookeeper=zookeeper, mode="async", acks=1, batch_size=500, linger_ms=5, monitoring=False,
                  enable_idempotence=False) as producer:  # one entry a message: ENTRY bytes each
        for _ in range(count):
            producer.send(TOPIC, value, partition=0)
        report = producer.close(300)
    assert not report.failed, report
    end = count * ENTRY
    with LogbusCluster(zookeeper) as cluster:
        deadline = time.monotonic() + 120
        while cluster.latest(TOPIC, 0) < end:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {cluster.latest(TOPIC, 0)} of {end} bytes flushed")
            time.sleep(0.1)
    return end


def run_child(code: str, zookeeper: str, end: int, fetch_bytes: int) -> dict:
    env = {**os.environ, "PYTHONPATH": code}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", "--zookeeper", zookeeper, "--end", str(end),
         "--fetch-bytes", str(fetch_bytes)],
        env=env, cwd=code, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the read with PYTHONPATH={code} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="messages in the range (default 1000000)")
    parser.add_argument("--code", action="append", metavar="NAME=DIR",
                        help="a version to run (repeat); default: this tree as 'current'")
    parser.add_argument("--fetch-bytes", type=int, action="append",
                        help="fetch size of read_range (repeat; default 8 MiB, the provider's, and 1 MiB)")
    parser.add_argument("--repeat", type=int, default=3, help="reads per version and fetch size (default 3)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--zookeeper", help=argparse.SUPPRESS)
    parser.add_argument("--end", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(read(args.zookeeper, args.end, args.fetch_bytes[0])))
        return
    # here, not at the top: a child runs this file with another version's tree on its path
    from harness.cluster import LocalCluster
    from harness.zookeeper import ZooKeeperServer

    logging.basicConfig(level=logging.WARNING)
    versions = [c.split("=", 1) for c in args.code or [f"current={Path.cwd()}"]]
    fetch_sizes = args.fetch_bytes or [8 << 20, 1 << 20]
    with tempfile.TemporaryDirectory(prefix="logbus-bench-range-") as scratch, \
            ZooKeeperServer(Path(scratch) / "zookeeper") as zk, LocalCluster(zk.connect_string, Path(scratch)) as cluster:
        cluster.start_broker(0, {"log.flush.interval.ms": 200, "log.flush.interval.messages": 100_000})
        end = produce(zk.connect_string, args.count)
        results: dict[tuple[str, int], list[dict]] = {}
        for _ in range(args.repeat):  # interleaved, so a busy moment of the shared machine hits both
            for fetch_bytes in fetch_sizes:
                for name, code in versions:
                    results.setdefault((name, fetch_bytes), []).append(run_child(code, zk.connect_string, end,
                                                                                 fetch_bytes))
    print(f"read_range of {args.count} messages ({end / 1e6:.0f} MB, {SIZE}-byte values), one partition, "
          f"one broker, {args.repeat} reads each, median (min-max)")
    print(f"{'version':10} {'fetch':>7} {'fetches':>8} {'seconds':>18} {'msg/s':>10} {'ZK requests':>12}  by type")
    for (name, fetch_bytes), runs in results.items():
        seconds = [r["seconds"] for r in runs]
        median = statistics.median(seconds)
        last = runs[-1]
        print(f"{name:10} {fetch_bytes >> 20:5d}Mi {last['fetches']:8d} "
              f"{median:7.2f} ({min(seconds):.2f}-{max(seconds):.2f}) {args.count / median:10.0f} "
              f"{last['zk_requests']:12d}  {json.dumps(last['by_type'], sort_keys=True)}")


if __name__ == "__main__":
    main()
