"""The load job: read a batch's ranges with the `logbus` data source, decode, write
Parquet into a fresh staging directory with the `logbus-parquet` data source (pyarrow on
the executors, no Hadoop filesystem: `spark/parquet_writer.py`), the values that do not
decode into `_rejects/`, and the counts per (topic, 10-minute window) the writer's tasks
counted beside them. Run with
spark-submit (LogbusSparkLoadOperator does), or call `run_load` with an existing
SparkSession.

    spark-submit load_job.py --ranges @ranges.json --zookeeper h:p/chroot \
        --staging /wh/table/_staging/<batch>.<attempt> --format json|confluent \
        [--registry-url https://registry:8081 [--avro-schema '{"type": "record", ...}']] \
        [--schema "a string, b long NOT NULL" | --schema /path/schema.json] \
        [--layout directory|iceberg] [--max-reject-rate 0.01] [--leader-wait 60]

Staging layouts::

    directory (default)                          iceberg
    <staging>/event_date=D/event_hour=H/part-*   <staging>/logbus_hour=N/part-*   N = hours since epoch
    <staging>/_rejects/part-*.parquet            <staging>/_rejects/part-*.parquet
    <staging>/_logbus_counts.json                <staging>/_logbus_counts.json

The iceberg layout writes TIMESTAMP_MICROS (Iceberg cannot read INT96), no
event_date/event_hour columns, and the value fields with the declared schema's types
(required fields as REQUIRED columns). Both have the Kafka record `headers` column
(docs/provider.md, "Record headers"). `_rejects/` holds topic, partition, offset,
timestamp, key, headers, value (the raw bytes) and error (what was wrong) for every value that
was empty, not JSON, not a JSON object, did not fit the schema, or lacked a required
field. The counts file::

    {"counts": [{"topic", "window_start", "count"}], "row_count": N,
     "rejected": [{"topic", "window_start", "count"}], "rejected_count": R,
     "schema": "<DDL used>", "schema_source": "declared" | "inferred" | null (raw),
     "layout": "directory" | "iceberg", "window_ms": 600000, "ranges": [...], "format": "json"}

When more than `--max-reject-rate` of a topic's values are rejected the job exits 1
without writing the counts file (the attempt can never be committed); the rejects stay
in staging for inspection.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from airflow_provider_logbus.cluster import LOAD_LEADER_WAIT_S, SECURITY_ENV, leader_wait_seconds
from airflow_provider_logbus.plan import Range, ranges_from_json, ranges_to_json
from airflow_provider_logbus.spark.decode_avro import parsed_reader, reader_schema
from airflow_provider_logbus.spark.decode_framed import decode_confluent
from airflow_provider_logbus.spark.decode import (
    ERROR, META_COLUMNS, RAW, REJECT, JsonSchema, decode_json, explain_rejects, json_schema, non_null_default,
    required_fields,
)
from airflow_provider_logbus.registry_access import REGISTRY_ENV, RegistryAccess, RegistryUnavailable
from airflow_provider_logbus.staged import COUNTS_FILE, REJECTS_DIR, load_result, write_result  # noqa: F401
from airflow_provider_logbus.storage import Storage, join, name_of, properties_from_environment

logger = logging.getLogger("logbus.load_job")
LOG_FORMAT = "%(asctime)s %(levelname)s [%(name)s] %(message)s"

WINDOW_MS = 600_000
HOUR_MICROS = 3_600_000_000
LAYOUTS = ("directory", "iceberg")
VALUE_FORMATS = ("raw", "json", "confluent")  # confluent: registry-framed Avro or JSON (`decode_framed.py`)
PARTITION_COLUMNS = {"directory": ("event_date", "event_hour"), "iceberg": ("logbus_hour",)}
FIRST_ERRORS = 3


class RejectRateError(RuntimeError):
    """More of a topic's values were rejected than `max_reject_rate` allows."""


def read_ranges(spark, ranges: Sequence[Range], zookeeper: str | None = None, brokers: str | None = None,
                fetch_bytes: int = 8 << 20, split_bytes: int = 256 << 20, leader_wait: float = LOAD_LEADER_WAIT_S,
                json_value: JsonSchema | None = None):
    """The `logbus` data source over `ranges`; with `json_value`, also its parse of the
    values where pyarrow's answer is Spark's (`spark/reader_json.py`)."""
    from airflow_provider_logbus.spark.datasource import LogbusDataSource

    spark.dataSource.register(LogbusDataSource)
    reader = spark.read.format("logbus").option("ranges", ranges_to_json(ranges))
    if json_value is not None:
        required, keep_values = required_fields(json_value)
        reader = (reader.option("json_value", json_value.struct.json()).option("json_required", json.dumps(required))
                  .option("json_keep_values", "true" if keep_values else "false"))
    if zookeeper:
        reader = reader.option("zookeeper", zookeeper)
    if brokers:
        reader = reader.option("brokers", brokers)
    if os.environ.get(SECURITY_ENV):
        reader = reader.option("security", os.environ[SECURITY_ENV])
    return (reader.option("fetch_bytes", str(fetch_bytes)).option("split_bytes", str(split_bytes))
            .option("leader_wait", str(leader_wait)).load())


def add_partition_columns(df, layout: str):
    from pyspark.sql import functions as F

    if layout == "directory":
        return df.withColumn("event_date", F.to_date("timestamp")).withColumn("event_hour", F.hour("timestamp"))
    return df.withColumn("logbus_hour", F.floor(F.unix_micros("timestamp") / HOUR_MICROS).cast("int"))


# ------------------------------------------------------------------ writing


def write_parquet(df, location: str, partition_by: Sequence[str] = (), int96: bool = False,
                  window_ms: int = WINDOW_MS, storage: Storage | None = None, reject_column: str | None = None) -> dict:
    """Write `df` as Parquet under `location` with the `logbus-parquet` data source
    (pyarrow on the executors; `spark/parquet_writer.py`); what it wrote and counted.
    Rows whose `reject_column` (a struct) is not null go to `<location>/_rejects/` as
    that struct's fields, in the same pass."""
    from airflow_provider_logbus.spark.parquet_writer import (STORAGE_OPTION, ParquetDataSource, read_written,
                                                              storage_option)

    storage = storage or Storage()
    df.sparkSession.dataSource.register(ParquetDataSource)
    writer = (df.write.format("logbus-parquet").mode("append").option("path", location)
              .option("partition_by", ",".join(partition_by)).option("int96", "true" if int96 else "false")
              .option("window_ms", str(window_ms)).option(STORAGE_OPTION, storage_option(storage)))
    if reject_column:
        writer = writer.option("rejects", REJECTS_DIR).option("reject_column", reject_column)
    writer.save()
    return read_written(location, storage)


def per_topic(counts: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        out[c["topic"]] = out.get(c["topic"], 0) + c["count"]
    return out


def check_reject_rate(spark, counts: list[dict], rejected: list[dict], max_reject_rate: float,
                      rejects_path: str) -> None:
    """Raise `RejectRateError` when a topic's rejected / (accepted + rejected) is over the limit."""
    from pyspark.sql import functions as F

    accepted, bad = per_topic(counts), per_topic(rejected)
    problems = []
    for topic in sorted(bad):
        total = bad[topic] + accepted.get(topic, 0)
        rate = bad[topic] / total
        if rate <= max_reject_rate:
            continue
        first = (spark.read.parquet(str(rejects_path)).filter(F.col("topic") == topic)
                 .orderBy("partition", "offset").select("partition", "offset", "error").limit(FIRST_ERRORS).collect())
        errors = "; ".join(f"partition {r.partition} offset {r.offset}: {r.error}" for r in first)
        problems.append(f"{bad[topic]} of {total} values of {topic} rejected ({rate:.2%}) — over max_reject_rate "
                        f"{max_reject_rate:.2%}; first errors: {errors}; rejects are in {rejects_path}")
    if problems:
        raise RejectRateError("\n".join(problems))


# ------------------------------------------------------------------ the job


def run_load(spark, ranges: Sequence[Range], staging: str, zookeeper: str | None = None, brokers: str | None = None,
             value_format: str = "json", schema: str | None = None, fetch_bytes: int = 8 << 20,
             split_bytes: int = 256 << 20, window_ms: int = WINDOW_MS, layout: str = "directory",
             max_reject_rate: float = 1.0, leader_wait: float = LOAD_LEADER_WAIT_S,
             parse_in_reader: bool = True, registry_url: str | None = None, avro_schema: str | None = None) -> dict:
    """Load `ranges` into Parquet under `staging` (which must not hold another attempt)
    in `layout`, written by pyarrow on the executors (`write_parquet`), which also count
    the rows; rejected values go to `<staging>/_rejects/`. Returns and writes the
    counts file; raises `RejectRateError` (and writes no counts file) when a topic's
    reject rate is over `max_reject_rate`. A partition without a reachable leader is
    waited for up to `leader_wait` seconds before the read fails naming it.
    `parse_in_reader=False` leaves every JSON value to Spark's `from_json` (the
    reference the reader's parse is tested against). `value_format="confluent"` decodes
    registry-framed Avro and JSON Schema values (`decode_framed.py`) into the declared
    `schema`'s columns, fetching writer schemas from `registry_url` with the credentials
    in `REGISTRY_ENV` (checked first: `RegistryUnavailable` before anything is read);
    Avro is resolved to `avro_schema` (the table's Avro record, JSON text), by default
    the declared `schema` when it is an Avro file."""
    from pyspark.sql import functions as F

    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    if value_format not in VALUE_FORMATS:
        raise ValueError(f"unknown value format {value_format!r}: use one of {', '.join(VALUE_FORMATS)}")
    if value_format == "confluent" and not (schema and registry_url):
        raise ValueError("value format 'confluent' needs the table's schema declared and the registry's URL")
    if value_format == "confluent":
        registry = RegistryAccess.from_environment(registry_url)
        registry.check()  # a wrong password or CA fails here, naming the registry, before Spark reads
        avro_schema = avro_schema or reader_schema(schema)
        if avro_schema:
            parsed_reader(avro_schema)  # not valid Avro: fails here, not in every task
    if not 0.0 <= max_reject_rate <= 1.0:
        raise ValueError(f"max_reject_rate {max_reject_rate} must be a fraction between 0 and 1")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    int96 = layout == "directory"  # as Spark writes timestamps by default; Iceberg reads TIMESTAMP_MICROS only
    storage = Storage(properties_from_environment())
    rejects_path = join(staging, REJECTS_DIR)
    storage.delete_dir(staging)
    source = read_ranges(spark, ranges, zookeeper, brokers, fetch_bytes, split_bytes, leader_wait)
    if value_format == "raw":
        written = write_parquet(add_partition_columns(source, layout), staging, PARTITION_COLUMNS[layout], int96,
                                window_ms, storage)
        schema_ddl = schema_source = None
    else:
        decoded = json_schema(spark, source, schema)
        schema_ddl, schema_source = decoded.ddl, decoded.source
        if value_format == "confluent":
            frame, outputs = decode_confluent(source, decoded, registry, PARTITION_COLUMNS[layout], avro_schema)
        else:
            if parse_in_reader:
                source = read_ranges(spark, ranges, zookeeper, brokers, fetch_bytes, split_bytes, leader_wait,
                                     decoded)
            frame, outputs = decode_json(source, decoded, PARTITION_COLUMNS[layout])
            # one pass writes both outputs: a rejected row carries its reject record, an
            # accepted one null there (`write_parquet`); the diagnosis runs for rejected rows only
            frame = explain_rejects(frame, decoded)
        required = [out for (f, out) in outputs if decoded.arrow is not None and not decoded.arrow.field(f).nullable]
        types = {out: decoded.struct[f].dataType for f, out in outputs}
        reject = F.when(F.col(ERROR).isNotNull(), F.struct(*META_COLUMNS, F.col(RAW).alias("value"),
                                                           F.col(ERROR).alias("error")))
        rows = frame.select(*META_COLUMNS, *[
            F.coalesce(F.col(out), non_null_default(types[out])).alias(out) if out in required else F.col(out)
            for _, out in outputs], reject.alias(REJECT))
        written = write_parquet(add_partition_columns(rows, layout), staging, PARTITION_COLUMNS[layout], int96,
                                window_ms, storage, reject_column=REJECT)
    result = load_result(ranges, value_format=value_format, layout=layout, schema=schema_ddl,
                         schema_source=schema_source, window_ms=window_ms, written=written)
    if result["rejected_count"]:
        logger.warning("%d values rejected into %s (%s)", result["rejected_count"], rejects_path,
                       ", ".join(f"{t}: {n}" for t, n in sorted(per_topic(result["rejected"]).items())))
        check_reject_rate(spark, result["counts"], result["rejected"], max_reject_rate, rejects_path)
    write_result(staging, result, storage)  # an empty batch writes no data files, only this
    logger.info("loaded %d rows (%d rejected) into %s, layout %s", result["row_count"], result["rejected_count"],
                staging, layout)
    return result


def reject_rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction between 0 and 1 (0.01 = 1%)")
    return value


def leader_wait(text: str) -> float:
    try:
        return leader_wait_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="load_job.py", description="Load logbus ranges into Parquet (staging).")
    parser.add_argument("--ranges", required=True, help="JSON list of {topic, partition, start, end}, or @file")
    parser.add_argument("--zookeeper")
    parser.add_argument("--brokers")
    parser.add_argument("--staging", required=True)
    parser.add_argument("--format", default="json", choices=VALUE_FORMATS)
    parser.add_argument("--registry-url", help="the schema registry of --format confluent values (comma-separated "
                                               "URLs are tried in turn); credentials and CA in $" + REGISTRY_ENV)
    parser.add_argument("--avro-schema", help="the table's Avro record (JSON text): --format confluent resolves Avro "
                                              "values to it (defaults, promotions)")
    parser.add_argument("--schema", help="the JSON values' schema: Spark DDL, or a .json file (JSON Schema or an "
                                         "Avro record); inferred from a sample (and logged) when absent")
    parser.add_argument("--layout", default="directory", choices=list(LAYOUTS),
                        help="directory: event_date=/event_hour= partitions; iceberg: logbus_hour= partitions, "
                             "TIMESTAMP_MICROS")
    parser.add_argument("--max-reject-rate", type=reject_rate, default=1.0,
                        help="fail when more than this fraction of a topic's values is rejected (default 1.0: never)")
    parser.add_argument("--fetch-bytes", type=int, default=8 << 20)
    parser.add_argument("--split-bytes", type=int, default=256 << 20)
    parser.add_argument("--window-ms", type=int, default=WINDOW_MS)
    parser.add_argument("--leader-wait", type=leader_wait, default=LOAD_LEADER_WAIT_S,
                        help="seconds to wait for a partition without a reachable leader before failing "
                             f"(default {LOAD_LEADER_WAIT_S:g})")
    parser.add_argument("--log-file", help="also write the job's log, and the traceback of its failure, here")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    args = arguments().parse_args(argv)
    if args.log_file:
        handler = logging.FileHandler(args.log_file, encoding="utf-8")
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(handler)
    text = Path(args.ranges[1:]).read_text() if args.ranges.startswith("@") else args.ranges
    ranges = ranges_from_json(text)
    from pyspark.sql import SparkSession

    from airflow_provider_logbus.schema import SchemaError

    spark = SparkSession.builder.appName(f"logbus-load {name_of(args.staging)}").getOrCreate()
    try:
        run_load(spark, ranges, args.staging, args.zookeeper, args.brokers, args.format, args.schema,
                 args.fetch_bytes, args.split_bytes, args.window_ms, args.layout, args.max_reject_rate,
                 args.leader_wait, registry_url=args.registry_url, avro_schema=args.avro_schema)
    except (RejectRateError, SchemaError, RegistryUnavailable) as exc:
        logger.error("load failed: %s", exc)
        _record_failure(args.staging, exc)
        return 1
    except Exception as exc:  # the traceback to the log (and its file), the cause to staging
        logger.exception("load failed")
        _record_failure(args.staging, exc)
        return 1
    except BaseException as exc:  # interrupted: still say why
        _record_failure(args.staging, exc)
        raise
    finally:
        spark.stop()
    return 0


# ------------------------------------------------------------------ the failure's cause, for the Airflow task


def _record_failure(staging: str, exc: BaseException) -> None:
    """`<staging>/_logbus_error.json`: the root cause LogbusSparkLoadOperator raises."""
    from airflow_provider_logbus.spark.failure import write_failure

    try:
        write_failure(staging, exc, Storage(properties_from_environment()))
    except Exception:  # never hide the job's own error
        logger.exception("could not record the load's failure in %s", staging)


if __name__ == "__main__":
    sys.exit(main())
