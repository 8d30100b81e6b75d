"""Benchmark: the load job (broker → `logbus` data source → JSON decode → Parquet)
against plain Spark reading the same records from a JSON-lines file (same schema, same
output columns and partitioning), both on `local[*]`.

    .venv/bin/python -m bench.spark_load --messages 1000000

Measured once (2 cores, 1M messages): plain Spark 21.3 s (46,943 msg/s), load job from
logbus 35.4 s (28,287 msg/s), ratio 0.60.

N messages of 200 bytes of JSON go to a 2-partition topic on one local broker (the
producing is not timed). Timed: the Parquet write of each path (the load job's
`run_load` without its counts pass, and `spark.read.json` + the same columns). The
machine's 2 cores are shared by Spark's tasks, the Python workers and the broker.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.client.connection import BrokerConnection  # noqa: E402
from broker.common.message import encode_message_set  # noqa: E402
from harness.cluster import LocalCluster  # noqa: E402
from harness.process import wait_until  # noqa: E402
from harness.zookeeper import ZooKeeperServer  # noqa: E402

SCHEMA = "server string, n long, ts_ms long, page string, pad string"


def value(i: int, ts: int) -> bytes:
    body = {"server": f"web-{i % 3}", "n": i, "ts_ms": ts, "page": f"/p/{i % 997}"}
    raw = json.dumps({**body, "pad": ""}).encode()
    out = json.dumps({**body, "pad": "x" * (200 - len(raw))}).encode()
    assert len(out) == 200
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    args = parser.parse_args()
    import os

    os.environ["PYSPARK_PYTHON"] = sys.executable
    work = Path(tempfile.mkdtemp(prefix="logbus-bench-"))
    zk = ZooKeeperServer(work / "zk")
    try:
        zk.start()
        connect = zk.connect_string + "/bench"
        with LocalCluster(connect, work, {"log.flush.interval.ms": 100}) as cluster:
            broker = cluster.start_broker(0)
            conn = BrokerConnection(*broker.address)
            conn.create_topic("bench", args.partitions)
            from airflow_provider_logbus.cluster import LogbusCluster

            lc = LogbusCluster(connect)
            wait_until(lambda: len(lc.partitions("bench")) == args.partitions, 30, "topic")
            t0 = int(time.time() * 1000) - 3_600_000
            jsonl = work / "input.jsonl"
            with open(jsonl, "wb") as f:
                batch: dict[int, list] = {p: [] for p in range(args.partitions)}
                for i in range(args.messages):
                    ts = t0 + i % 3_600_000
                    v = value(i, ts)
                    f.write(v + b"\n")
                    p = i % args.partitions
                    batch[p].append((None, v, ts))
                    if len(batch[p]) == 2000:
                        conn.produce("bench", p, encode_message_set(batch[p]))
                        batch[p] = []
                for p, rest in batch.items():
                    if rest:
                        conn.produce("bench", p, encode_message_set(rest))
            total = args.messages * (22 + 200)
            wait_until(lambda: sum(lc.latest("bench", p) for p in range(args.partitions)) == total, 60, "flush")
            from airflow_provider_logbus.plan import Range

            ranges = [Range("bench", p, o.earliest, o.latest) for p, o in lc.partition_offsets("bench").items()]
            size = sum(r.end - r.start for r in ranges)
            print(f"{args.messages} messages, {size / 1e6:.0f} MB in the broker, {jsonl.stat().st_size / 1e6:.0f} MB JSON-lines")

            from pyspark.sql import SparkSession
            from pyspark.sql import functions as F

            from airflow_provider_logbus.spark.load_job import decode, read_ranges

            spark = (SparkSession.builder.master("local[*]").config("spark.driver.memory", "4g")
                     .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "false")
                     .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            # warm-up of both paths, not timed: the JVM, the JSON reader, and the Python
            # workers with their imports (pyarrow, numpy, the data source) — the second
            # path would otherwise pay for starting them inside its measurement
            spark.read.json(str(jsonl)).limit(10).collect()
            tiny = [Range(r.topic, r.partition, r.start, min(r.end, r.start + 100 * (200 + 22)))
                    for r in ranges]  # 100 whole entries
            decode(spark, read_ranges(spark, tiny, zookeeper=connect), "json", SCHEMA).count()

            def from_broker(out: str) -> None:
                df = decode(spark, read_ranges(spark, ranges, zookeeper=connect), "json", SCHEMA)
                df.write.partitionBy("event_date", "event_hour").mode("overwrite").parquet(out)

            def from_file(out: str) -> None:
                df = spark.read.schema(SCHEMA).json(str(jsonl))
                ts = F.timestamp_millis("ts_ms")
                df = (df.select(F.lit("bench").alias("topic"), F.lit(0).alias("partition"), F.lit(0).cast("long").alias("offset"),
                                ts.alias("timestamp"), F.lit(None).cast("binary").alias("key"), "server", "n", "ts_ms", "page", "pad")
                      .withColumn("event_date", F.to_date("timestamp")).withColumn("event_hour", F.hour("timestamp")))
                df.write.partitionBy("event_date", "event_hour").mode("overwrite").parquet(out)

            results = {}
            for name, fn in (("plain Spark from JSON-lines", from_file), ("load job from logbus", from_broker)):
                out = str(work / name.replace(" ", "_"))
                start = time.perf_counter()
                fn(out)
                elapsed = time.perf_counter() - start
                rows = spark.read.parquet(out).count()
                assert rows == args.messages, (name, rows)
                results[name] = args.messages / elapsed
                print(f"{name:<30} {elapsed:7.1f} s  {results[name]:>10,.0f} messages/s  ({rows} rows)")
            ratio = results["load job from logbus"] / results["plain Spark from JSON-lines"]
            print(f"ratio logbus / plain = {ratio:.2f}")
            spark.stop()
    finally:
        zk.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
