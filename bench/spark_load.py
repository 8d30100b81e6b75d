"""Benchmark: the load job (broker → `logbus` data source → JSON decode → Parquet)
against plain Spark reading the same records from a JSON-lines file (same schema, same
output columns and partitioning), both on `local[*]`.

    .venv/bin/python -m bench.spark_load --messages 1000000 --rounds 3 [--s3]

N messages of 200 bytes of JSON go to a 2-partition topic on one local broker (the
producing is not timed). Timed: (a) the load job's own `run_load` with the declared
schema — the `logbus` data source, decoding, the Parquet write of the accepted rows and
of the (empty) rejects, and its counts pass over what it wrote; (b) `spark.read.json` of
the file with the same schema, the same output columns, and the Parquet write. Both
paths are warmed up first (JVM, Python workers and their imports). The machine's cores
are shared by Spark's tasks, the Python workers and the broker. With `--s3`, (c) the
load job into a bucket of an S3 API server on this machine (moto's, `harness/s3.py`: an
HTTP server in Python, so the figure bounds the protocol's cost, not a real store's).

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
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

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


def produce(conn: BrokerConnection, topic: str, count: int, partitions: int = 2, lines: Path | None = None,
            encode: Callable[[int, int], bytes] = value) -> int:
    """`count` messages round-robin over `partitions`, stamped within the last hour, in
    sets of 2,000; each value also as a line of `lines` when given. `encode(i, ts)`: the
    value (by default `value`'s JSON). Returns the bytes of the values."""
    t0 = int(time.time() * 1000) - HOUR_MS
    batch: dict[int, list] = {p: [] for p in range(partitions)}
    produced = 0
    with open(lines or os.devnull, "wb") as f:
        for i in range(count):
            ts = t0 + i % HOUR_MS
            v = encode(i, ts)
            produced += len(v)
            f.write(v + b"\n")
            p = i % partitions
            batch[p].append((None, v, ts))
            if len(batch[p]) == 2000:
                conn.produce(topic, p, encode_message_set(batch[p]))
                batch[p] = []
    for p, rest in batch.items():
        if rest:
            conn.produce(topic, p, encode_message_set(rest))
    return produced


LOCAL, PLAIN, S3 = "load job from logbus", "plain Spark from JSON-lines", "load job into S3"


def measure(spark, work: Path, zookeeper: str, ranges: list, jsonl: Path, messages: int,
            rounds: int = 1, bucket: str | None = None) -> dict[str, list[float]]:
    """messages/s of each path in each round, warmed up first."""
    from pyspark.sql import functions as F

    from airflow_provider_logbus.plan import Range
    from airflow_provider_logbus.spark.load_job import run_load
    from airflow_provider_logbus.staged import REJECTS_DIR
    from airflow_provider_logbus.storage import Storage, is_uri, properties_from_environment

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
    def rows_in(out: str) -> int:
        if not is_uri(out):
            return spark.read.parquet(out).count()
        storage = Storage(properties_from_environment())
        return sum(storage.parquet_rows(f) for f in storage.files(out, ".parquet") if f"/{REJECTS_DIR}/" not in f)

    spark.read.json(str(jsonl)).limit(10).collect()
    few = [Range(r.topic, r.partition, r.start, min(r.end, r.start + 100 * ENTRY)) for r in ranges]  # 100 entries
    from_broker(str(work / "warm-up"), few)
    if bucket:
        from_broker(f"{bucket}/warm-up", few)
    rates: dict[str, list[float]] = {}
    paths = [(PLAIN, from_file, str(work)), (LOCAL, from_broker, str(work))] + ([(S3, from_broker, bucket)]
                                                                               if bucket else [])
    for round_ in range(rounds):
        for name, fn, root in (paths if round_ % 2 == 0 else paths[::-1]):  # alternating: all see the same machine
            out = f"{root}/{name.replace(' ', '_')}-{round_}"
            start = time.perf_counter()
            fn(out)
            elapsed = time.perf_counter() - start
            rows = rows_in(out)
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
    parser.add_argument("--s3", action="store_true", help="also load into a bucket of a local S3 API server")
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
        with ExitStack() as stack:
            bucket = None
            if args.s3:
                from airflow_provider_logbus.storage import STORAGE_ENV
                from harness.s3 import S3Server

                s3 = stack.enter_context(S3Server(work / "s3"))
                bucket = s3.create_bucket("bench")
                os.environ[STORAGE_ENV] = json.dumps(s3.properties())  # as the operator hands it to the job
            spark = stack.enter_context(local_session(conf={"spark.driver.memory": "4g"}))
            rates = measure(spark, work, cluster.zookeeper, ranges, jsonl, args.messages, args.rounds, bucket)
    print_ratio("logbus / plain", rates[LOCAL], rates[PLAIN])
    if args.s3:
        print_ratio("S3 / local", rates[S3], rates[LOCAL])
    return 0


def print_ratio(name: str, numerators: list[float], denominators: list[float]) -> None:
    ratios = [a / b for a, b in zip(numerators, denominators)]
    print(f"ratio {name} = {statistics.median(ratios):.2f}"
          + (f" (median of {len(ratios)}: {', '.join(f'{r:.2f}' for r in ratios)})" if len(ratios) > 1 else ""))


if __name__ == "__main__":
    sys.exit(main())
