"""Benchmark: the load job (broker → `logbus` data source → JSON decode → Parquet)
against plain Spark reading the same records from a JSON-lines file (same schema, same
output columns and partitioning), both on `local[*]`.

    .venv/bin/python -m bench.spark_load --messages 1000000 --rounds 3

N messages of 200 bytes of JSON go to a 2-partition topic on one local broker (the
producing is not timed). Timed: (a) the load job's own `run_load` with the declared
schema — the `logbus` data source, decoding, the Parquet write of the accepted rows and
of the (empty) rejects, and its counts pass over what it wrote; (b) `spark.read.json` of
the file with the same schema, the same output columns, and the Parquet write. Both
paths are warmed up first (JVM, Python workers and their imports). The machine's cores
are shared by Spark's tasks, the Python workers and the broker.

ZooKeeper, the broker and Spark's JVM run only meanwhile, in a scratch directory, and
are stopped on the way out, also on failure (exit status 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from broker.client.connection import BrokerConnection
from broker.common.message import encode_message_set
from harness.cluster import scratch_cluster
from harness.process import wait_until
from harness.spark import local_session

SCHEMA = "server string, n long, ts_ms long, page string, pad string"
ENTRY = 222  # bytes per 200-byte message in the log (22-byte header)
HOUR_MS = 3_600_000


def value(i: int, ts: int) -> bytes:
    body = {"server": f"web-{i % 3}", "n": i, "ts_ms": ts, "page": f"/p/{i % 997}"}
    raw = json.dumps({**body, "pad": ""}).encode()
    out = json.dumps({**body, "pad": "x" * (200 - len(raw))}).encode()
    assert len(out) == 200
    return out


def produce(conn: BrokerConnection, topic: str, count: int, partitions: int = 2, lines: Path | None = None) -> None:
    """`count` messages round-robin over `partitions`, stamped within the last hour, in
    sets of 2,000; each value also as a line of `lines` when given."""
    t0 = int(time.time() * 1000) - HOUR_MS
    batch: dict[int, list] = {p: [] for p in range(partitions)}
    with open(lines or os.devnull, "wb") as f:
        for i in range(count):
            ts = t0 + i % HOUR_MS
            v = value(i, ts)
            f.write(v + b"\n")
            p = i % partitions
            batch[p].append((None, v, ts))
            if len(batch[p]) == 2000:
                conn.produce(topic, p, encode_message_set(batch[p]))
                batch[p] = []
    for p, rest in batch.items():
        if rest:
            conn.produce(topic, p, encode_message_set(rest))


def measure(spark, work: Path, zookeeper: str, ranges: list, jsonl: Path, messages: int,
            rounds: int = 1) -> dict[str, list[float]]:
    """messages/s of each path in each round, warmed up first."""
    from pyspark.sql import functions as F

    from airflow_provider_logbus.plan import Range
    from airflow_provider_logbus.spark.load_job import run_load

    def from_broker(out: str, load: list = ranges) -> None:
        result = run_load(spark, load, out, zookeeper=zookeeper, value_format="json", schema=SCHEMA)
        if result["rejected_count"]:
            raise RuntimeError(f"the load job rejected {result['rejected_count']} values: {result['rejected']}")

    def from_file(out: str) -> None:
        df = spark.read.schema(SCHEMA).json(str(jsonl))
        ts = F.timestamp_millis("ts_ms")
        df = (df.select(F.lit("bench").alias("topic"), F.lit(0).alias("partition"), F.lit(0).cast("long").alias("offset"),
                        ts.alias("timestamp"), F.lit(None).cast("binary").alias("key"), "server", "n", "ts_ms", "page", "pad")
              .withColumn("event_date", F.to_date("timestamp")).withColumn("event_hour", F.hour("timestamp")))
        df.write.partitionBy("event_date", "event_hour").mode("overwrite").parquet(out)

    # warm-up of both paths, not timed: the JVM, the JSON reader, and the Python workers
    # with their imports (pyarrow, numpy, the data source) — the second path would
    # otherwise pay for starting them inside its measurement
    spark.read.json(str(jsonl)).limit(10).collect()
    from_broker(str(work / "warm-up"), [Range(r.topic, r.partition, r.start, min(r.end, r.start + 100 * ENTRY))
                                        for r in ranges])  # 100 whole entries
    rates: dict[str, list[float]] = {}
    paths = [("plain Spark from JSON-lines", from_file), ("load job from logbus", from_broker)]
    for round_ in range(rounds):
        for name, fn in (paths if round_ % 2 == 0 else paths[::-1]):  # alternating: both see the same machine
            out = str(work / f"{name.replace(' ', '_')}-{round_}")
            start = time.perf_counter()
            fn(out)
            elapsed = time.perf_counter() - start
            rows = spark.read.parquet(out).count()
            if rows != messages:
                raise RuntimeError(f"{name}: {rows} rows written of {messages}")
            rates.setdefault(name, []).append(messages / elapsed)
            print(f"{name:<30} {elapsed:7.1f} s  {messages / elapsed:>10,.0f} messages/s  ({rows} rows)", flush=True)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each path, alternating which goes first")
    args = parser.parse_args(argv)
    from airflow_provider_logbus.cluster import LogbusCluster
    from airflow_provider_logbus.plan import Range

    # innermost first on the way out: the ZooKeeper clients (whose watches would retry
    # for ever at exit), then Spark, the broker and ZooKeeper
    with scratch_cluster("logbus-bench-spark-", {"log.flush.interval.ms": 100}) as (_, cluster):
        work = cluster.workdir
        broker = cluster.start_broker(0)
        jsonl = work / "input.jsonl"
        with BrokerConnection(*broker.address) as conn, LogbusCluster(cluster.zookeeper) as logbus:
            conn.create_topic("bench", args.partitions)
            wait_until(lambda: len(logbus.partitions("bench")) == args.partitions, 30, "topic")
            produce(conn, "bench", args.messages, args.partitions, jsonl)
            total = args.messages * ENTRY
            wait_until(lambda: sum(logbus.latest("bench", p) for p in range(args.partitions)) == total, 60, "flush")
            ranges = [Range("bench", p, o.earliest, o.latest) for p, o in logbus.partition_offsets("bench").items()]
        print(f"{args.messages} messages, {total / 1e6:.1f} MB in the broker, {jsonl.stat().st_size / 1e6:.1f} MB "
              f"JSON-lines", flush=True)
        with local_session(conf={"spark.driver.memory": "4g"}) as spark:
            rates = measure(spark, work, cluster.zookeeper, ranges, jsonl, args.messages, args.rounds)
    ratios = [b / p for b, p in zip(rates["load job from logbus"], rates["plain Spark from JSON-lines"])]
    print(f"ratio logbus / plain = {statistics.median(ratios):.2f}"
          + (f" (median of {len(ratios)}: {', '.join(f'{r:.2f}' for r in ratios)})" if len(ratios) > 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
