"""The load job: read a batch's ranges with the `logbus` data source, decode, write
Parquet into a fresh staging directory and the counts per (topic, 10-minute window)
beside it. Run with spark-submit (LogbusSparkLoadOperator does), or call `run_load`
with an existing SparkSession.

    spark-submit load_job.py --ranges @ranges.json --zookeeper h:p/chroot \
        --staging /wh/table/_staging/<batch>.<attempt> --format json [--schema "a string, b long"]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from pathlib import Path

logger = logging.getLogger("logbus.load_job")

META_COLUMNS = ("topic", "partition", "offset", "timestamp", "key")
COUNTS_FILE = "_logbus_counts.json"  # same as warehouse.COUNTS_FILE (no provider import needed here)
WINDOW_MS = 600_000


def read_ranges(spark, ranges: list[dict], zookeeper: str | None = None, brokers: str | None = None,
                fetch_bytes: int = 8 << 20, split_bytes: int = 256 << 20):
    from airflow_provider_logbus.spark.datasource import LogbusDataSource

    spark.dataSource.register(LogbusDataSource)
    reader = spark.read.format("logbus").option("ranges", json.dumps(ranges))
    if zookeeper:
        reader = reader.option("zookeeper", zookeeper)
    if brokers:
        reader = reader.option("brokers", brokers)
    return reader.option("fetch_bytes", str(fetch_bytes)).option("split_bytes", str(split_bytes)).load()


def infer_json_schema(spark, df, sample: int = 1000):
    rows = [r.value.decode("utf-8", "replace") for r in df.select("value").limit(sample).collect() if r.value]
    if not rows:
        from pyspark.sql.types import StructType

        return StructType([])
    return spark.read.json(spark.sparkContext.parallelize(rows)).schema


def decode(spark, df, value_format: str = "json", schema: str | None = None):
    """Add the decoded value columns, event_date and event_hour (UTC)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    if value_format == "raw":
        out = df
    elif value_format == "json":
        struct = StructType.fromDDL(schema) if schema else infer_json_schema(spark, df)
        fields = [f.name for f in struct.fields]
        clashes = [f for f in fields if f in META_COLUMNS or f in ("event_date", "event_hour")]
        if clashes:
            logger.warning("JSON fields %s clash with logbus columns; they are kept as value_<name>", clashes)
        data = F.from_json(F.col("value").cast("string"), struct)
        out = df.select(*META_COLUMNS, *[
            data.getField(f).alias(f"value_{f}" if f in clashes else f) for f in fields
        ])
    else:
        raise ValueError(f"unknown value format {value_format!r}: use 'raw' or 'json'")
    return out.withColumn("event_date", F.to_date("timestamp")).withColumn("event_hour", F.hour("timestamp"))


def window_counts(spark, path: str, window_ms: int = WINDOW_MS) -> tuple[list[dict], int]:
    """Rows per (topic, window of the message timestamp), read back from the written files."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(path).select("topic", "timestamp")
    start = (F.floor(F.unix_millis("timestamp") / window_ms) * window_ms).cast("long")
    rows = df.groupBy("topic", start.alias("window_start")).count().collect()
    counts = sorted(({"topic": r.topic, "window_start": int(r.window_start), "count": int(r["count"])} for r in rows),
                    key=lambda c: (c["topic"], c["window_start"]))
    return counts, sum(c["count"] for c in counts)


def run_load(spark, ranges: list[dict], staging: str, zookeeper: str | None = None, brokers: str | None = None,
             value_format: str = "json", schema: str | None = None, fetch_bytes: int = 8 << 20,
             split_bytes: int = 256 << 20, window_ms: int = WINDOW_MS) -> dict:
    """Load `ranges` into Parquet under `staging` (which must not hold another attempt);
    returns and writes the counts file."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    staging_path = Path(staging)
    if staging_path.exists():
        shutil.rmtree(staging_path)
    df = decode(spark, read_ranges(spark, ranges, zookeeper, brokers, fetch_bytes, split_bytes), value_format, schema)
    df.write.partitionBy("event_date", "event_hour").mode("errorifexists").parquet(str(staging_path))
    staging_path.mkdir(parents=True, exist_ok=True)  # an empty batch writes no files
    if any(staging_path.rglob("*.parquet")):
        counts, row_count = window_counts(spark, str(staging_path), window_ms)
    else:
        counts, row_count = [], 0
    result = {"counts": counts, "row_count": row_count, "window_ms": window_ms,
              "ranges": ranges, "format": value_format}
    tmp = staging_path / f".{COUNTS_FILE}.tmp"
    tmp.write_text(json.dumps(result, indent=1, sort_keys=True))
    os.replace(tmp, staging_path / COUNTS_FILE)
    logger.info("loaded %d rows into %s", row_count, staging)
    return result


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="load_job.py", description="Load logbus ranges into Parquet (staging).")
    parser.add_argument("--ranges", required=True, help="JSON list of {topic, partition, start, end}, or @file")
    parser.add_argument("--zookeeper")
    parser.add_argument("--brokers")
    parser.add_argument("--staging", required=True)
    parser.add_argument("--format", default="json", choices=["raw", "json"])
    parser.add_argument("--schema", help="Spark DDL of the JSON values; inferred from a sample when absent")
    parser.add_argument("--fetch-bytes", type=int, default=8 << 20)
    parser.add_argument("--split-bytes", type=int, default=256 << 20)
    parser.add_argument("--window-ms", type=int, default=WINDOW_MS)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [%(name)s] %(message)s")
    args = arguments().parse_args(argv)
    text = Path(args.ranges[1:]).read_text() if args.ranges.startswith("@") else args.ranges
    ranges = json.loads(text)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"logbus-load {Path(args.staging).name}").getOrCreate()
    try:
        run_load(spark, ranges, args.staging, args.zookeeper, args.brokers, args.format, args.schema,
                 args.fetch_bytes, args.split_bytes, args.window_ms)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
