"""What followers cost while nothing is produced (not a test): three brokers holding more
and more replicated partitions (RF 3), idle, with the connections between brokers and
the brokers' CPU time over a quiet interval.

    PYTHONPATH=$PWD .venv/bin/python -m bench.replica_idle --code before=/tmp/base --code after=$PWD

Each `--code NAME=DIR` runs its own ZooKeeper server and brokers with PYTHONPATH=DIR, so
two versions of the broker are compared in one run on the same schedule: at each
partition count, once every ISR is full, the connections each broker holds to the other
brokers' ports are counted (from /proc) and the brokers' user+system CPU seconds are
read over `--seconds` of idleness. A follower long-polls its leader
(`replica.fetch.wait.max.ms`, 500 ms): the cost of an idle follower is those polls.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

from harness.cluster import LocalCluster
from harness.process import cpu_seconds, wait_until
from harness.sockets import connections_to, descendants
from harness.zookeeper import ZooKeeperServer, client

def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` and its descendants, so far."""
    total = 0.0
    for each in descendants(pid):
        with contextlib.suppress(OSError):  # ended meanwhile
            total += cpu_seconds(each)
    return total


def full_isrs(zk, topics: list[str]) -> bool:
    from broker.common.zklayout import read_assignment, read_partition_state

    for topic in topics:
        assignment = read_assignment(zk, topic) or {}
        if not assignment:
            return False
        for partition, replicas in assignment.items():
            node = read_partition_state(zk, topic, partition)
            if node is None or sorted(node.state.isr) != sorted(replicas):
                return False
    return True


def run(code: str, work: Path, counts: list[int], seconds: float) -> list[dict]:
    from broker.client.connection import BrokerConnection

    os.environ["PYTHONPATH"] = code  # the brokers' code
    rows, topics, created = [], [], 0
    with ZooKeeperServer(work / "zookeeper") as zookeeper, LocalCluster(zookeeper.connect_string, work) as cluster:
        cluster.start(3)
        with client(zookeeper.connect_string) as zk:
            for count in counts:
                topic = f"idle-{count}"
                with BrokerConnection(*cluster.brokers[0].address) as connection:
                    connection.create_topic(topic, count - created, 3)
                topics.append(topic)
                created = count
                wait_until(lambda: full_isrs(zk, topics), 120, f"full ISRs of {count} partitions", 0.5)
                time.sleep(2)  # the last joins settle
                pids = {b: broker.process.pid for b, broker in cluster.brokers.items()}
                links = {f"{f}->{l}": connections_to(cluster.brokers[l].port, pids[f])
                         for f in pids for l in pids if f != l}
                before = sum(tree_cpu_seconds(p) for p in pids.values())
                time.sleep(seconds)
                used = sum(tree_cpu_seconds(p) for p in pids.values()) - before
                rows.append({"partitions": count, "connections": links,
                             "broker_cpu_percent": round(100 * used / seconds, 1)})
                print(f"  {count:4d} partitions: {sum(links.values())} connections between brokers, "
                      f"brokers' CPU {rows[-1]['broker_cpu_percent']}% of one core while idle", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", action="append", required=True, help="NAME=DIR: a source tree of the broker")
    parser.add_argument("--partitions", default="3,30,150", help="partition counts, cumulative")
    parser.add_argument("--seconds", type=float, default=10.0, help="idle interval measured")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    counts = [int(c) for c in args.partitions.split(",")]
    results = {}
    for spec in args.code:
        name, _, code = spec.partition("=")
        print(f"{name} ({code}):", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"logbus-idle-{name}-") as work:
            results[name] = run(str(Path(code).resolve()), Path(work), counts, args.seconds)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
