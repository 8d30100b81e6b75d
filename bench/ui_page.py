"""Benchmark (issue 22): what one view of the Airflow page costs on a table with many
batches — the answers of its three JSON routes, computed by `airflow_provider_logbus.ui.status`
(the code the routes call) and serialized as the routes do.

    .venv/bin/python -m bench.ui_page                       # 1,000 hourly batches, both targets
    .venv/bin/python -m bench.ui_page --batches 200 --rounds 3

A real ZooKeeper and broker hold the topic `bench` (2 partitions) and the monitoring
topic; N hourly batches of real Parquet files (5 rows each) are committed through each
target's commit protocol (`bench.iceberg.commit_hour`). Then, per target and round:
`hours` for the default view (the last 48 hours of the table), `hours` for the whole
table, `lag`, and the JSON size of each answer. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

from bench.iceberg import YEAR_START, commit_hour, open_kind, value_schema
from harness.cluster import LocalCluster
from harness.zookeeper import ZooKeeperServer

HOUR_MS = 3_600_000


def audited(kind: str):
    from airflow_provider_logbus.ui.status import AuditedTable

    return AuditedTable(dag_id="bench", task_id="audit", table=f"page_{kind}", topic="bench", target=kind,
                        warehouse=None, catalog_conn_id="", logbus_conn_id="", threshold=0.999, grace_ms=HOUR_MS,
                        monitoring_topic="_logbus_monitoring")


def timed(call) -> tuple[float, int]:
    t0 = time.perf_counter()
    answer = call()
    size = len(json.dumps(answer))
    return time.perf_counter() - t0, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--targets", default="directory,iceberg")
    args = parser.parse_args()

    from airflow_provider_logbus.cluster import LogbusCluster
    from airflow_provider_logbus.ui.status import PageTable, hours, lag
    from broker.client.producer import Producer

    work = Path(tempfile.mkdtemp(prefix="bench-ui-page-"))
    try:
        with ExitStack() as stack:
            zookeeper = stack.enter_context(ZooKeeperServer(work / "zk"))
            local = stack.enter_context(LocalCluster(zookeeper.connect_string + "/bench", work / "brokers",
                                                     {"num.partitions": 2, "log.flush.interval.ms": 20}))
            local.start_broker(0)
            with Producer(zookeeper=local.zookeeper, acks=1, monitoring=True) as producer:
                for i in range(200):
                    producer.send("bench", b'{"n": %d}' % i, key=str(i))
            end_ms = int((YEAR_START + timedelta(hours=args.batches)).timestamp() * 1000)
            print(f"{args.batches} hourly batches per target, {args.rounds} rounds")
            print(f"{'target':<10} {'answer':<28} {'median s':>9} {'max s':>7} {'JSON bytes':>11}")
            for kind in args.targets.split(","):
                table = audited(kind)
                target = open_kind(kind, work / f"wh-{kind}", table.table)
                stack.callback(target.close)
                t0 = time.perf_counter()
                target.ensure_schema(value_schema())
                for h in range(args.batches):
                    commit_hour(target, h)
                print(f"{kind:<10} {args.batches} commits in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
                cluster = stack.enter_context(LogbusCluster(local.zookeeper))
                page = PageTable((table,))  # the page's entry: this table's one audit
                views = {
                    "hours, last 48 h": lambda: hours(page, cluster, target, end_ms - 48 * HOUR_MS, end_ms,
                                                      end_ms + HOUR_MS),
                    f"hours, all {args.batches} h": lambda: hours(page, cluster, target, end_ms - args.batches * HOUR_MS,
                                                                 end_ms, end_ms + HOUR_MS),
                    "lag": lambda: lag(table, cluster, target, end_ms + HOUR_MS),
                }
                for name, view in views.items():
                    runs = [timed(view) for _ in range(args.rounds)]
                    seconds = [s for s, _ in runs]
                    print(f"{kind:<10} {name:<28} {statistics.median(seconds):>9.3f} {max(seconds):>7.3f} "
                          f"{runs[-1][1]:>11,}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
