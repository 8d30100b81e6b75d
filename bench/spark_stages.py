"""Where the Spark load's time goes (not a test): the load job's stages one by one, each
ending in Spark's `noop` sink, beside plain Spark reading the same records from a
JSON-lines file; `--rounds` passes, the first of which warms everything up.

    .venv/bin/python -m bench.spark_stages --messages 1000000 --rounds 2

Stages: the logbus data source alone (fetch and decode to Arrow in the Python
workers); the same with its own JSON parse (pyarrow, `spark/reader_json.py`, as the
load job reads); the plain data source and Spark's JSON parse of every value with the
reject diagnosis (`decode_json`); the same with the diagnosis column dropped; the whole
`run_load`; the decoded rows written by Spark's
own Parquet writer and by the load job's pyarrow writer (`spark/parquet_writer.py`, which
also counts them); plain Spark's read and parse of the file.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.spark_load import ENTRY, SCHEMA, produce
from broker.client.connection import BrokerConnection
from harness.cluster import scratch_cluster
from harness.process import wait_until
from harness.spark import local_session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    from airflow_provider_logbus.cluster import LogbusCluster
    from airflow_provider_logbus.plan import Range
    from airflow_provider_logbus.spark import decode, load_job

    with scratch_cluster("logbus-bench-stages-", {"log.flush.interval.ms": 100}) as (_, cluster):
        work = cluster.workdir
        broker = cluster.start_broker(0)
        with BrokerConnection(*broker.address) as conn, LogbusCluster(cluster.zookeeper) as logbus:
            conn.create_topic("bench", 2)
            wait_until(lambda: len(logbus.partitions("bench")) == 2, 30, "topic")
            produce(conn, "bench", args.messages, 2, work / "input.jsonl")
            wait_until(lambda: sum(logbus.latest("bench", p) for p in range(2)) == args.messages * ENTRY, 60,
                       "flush")
            ranges = [Range("bench", p, o.earliest, o.latest) for p, o in logbus.partition_offsets("bench").items()]
        with local_session(conf={"spark.driver.memory": "4g"}) as spark:
            def source():
                return load_job.read_ranges(spark, ranges, cluster.zookeeper)

            def decoded(keep_error: bool):
                frame, _ = decode.decode_json(source(), decode.json_schema(spark, source(), SCHEMA),
                                                load_job.PARTITION_COLUMNS["directory"])
                return frame if keep_error else frame.drop(decode.ERROR, decode.RAW)

            def partitioned():
                return load_job.add_partition_columns(decoded(False), "directory")

            def noop(frame) -> None:
                frame.write.format("noop").mode("overwrite").save()

            columns = load_job.PARTITION_COLUMNS["directory"]
            for round_ in range(args.rounds):
                out = str(work / f"load-{round_}")
                stages = [
                    ("logbus data source", lambda: noop(source())),
                    ("logbus data source with its JSON parse", lambda: noop(load_job.read_ranges(
                        spark, ranges, cluster.zookeeper, json_value=decode.json_schema(spark, source(), SCHEMA)))),
                    ("+ JSON parse and reject diagnosis", lambda: noop(decoded(True))),
                    ("+ JSON parse, diagnosis dropped", lambda: noop(decoded(False))),
                    ("the whole run_load", lambda: load_job.run_load(spark, ranges, out, zookeeper=cluster.zookeeper,
                                                                     value_format="json", schema=SCHEMA)),
                    ("decoded -> Spark's Parquet writer", lambda: partitioned().write.partitionBy(*columns).parquet(
                        str(work / f"spark-writer-{round_}"))),
                    ("decoded -> pyarrow writer (logbus-parquet)", lambda: load_job.write_parquet(
                        partitioned(), str(work / f"pyarrow-writer-{round_}"), columns, int96=True)),
                    ("plain Spark: read and parse the file",
                     lambda: noop(spark.read.schema(SCHEMA).json(str(work / "input.jsonl")))),
                ]
                for name, stage in stages:
                    start = time.perf_counter()
                    stage()
                    print(f"round {round_ + 1} {name:42} {time.perf_counter() - start:6.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
