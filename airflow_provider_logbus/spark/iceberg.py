"""Reading a logbus Iceberg table from Spark without the Iceberg Spark runtime jar
(it is not on PyPI): pyiceberg plans the scan — current snapshot, partition pruning by
hour — and Spark reads the planned Parquet files: with its own reader on a disk, with
the `logbus-parquet` data source (pyarrow) on an object store, where Spark's reader would
need Hadoop's connector jars.

    from airflow_provider_logbus.spark.iceberg import read_iceberg
    df = read_iceberg(spark, table, row_filter="timestamp >= '2024-01-01T10:00:00+00:00'")

Deletes are not supported (logbus tables are append-only), and a column added by schema
evolution is read as null from files written before it (`mergeSchema`).
"""

from __future__ import annotations

import json

from airflow_provider_logbus.storage import Storage, is_uri


def planned_files(table, row_filter: str | None = None) -> list[str]:
    """Data files of the table's current snapshot that `row_filter` may touch."""
    scan = table.scan(row_filter=row_filter) if row_filter else table.scan()
    return [task.file.file_path for task in scan.plan_files()]


def read_iceberg(spark, table, row_filter: str | None = None):
    """A DataFrame of the table's current snapshot (columns by the table's schema)."""
    from pyspark.sql import functions as F

    from airflow_provider_logbus.schema import ddl_type
    from airflow_provider_logbus.targets.iceberg_tables import small_types

    schema = small_types(table.schema().as_arrow())
    files = planned_files(table, row_filter)
    if not files:
        return spark.createDataFrame([], schema=", ".join(f"`{f.name}` {ddl_type(f.type)}" for f in schema))
    if any(is_uri(f) for f in files):
        return _read_through_pyarrow(spark, files, schema, table.io.properties)
    df = spark.read.option("mergeSchema", "true").parquet(*files)
    return df.select(*[F.col(f.name) if f.name in df.columns else F.lit(None).cast(ddl_type(f.type)).alias(f.name)
                       for f in schema])


def _read_through_pyarrow(spark, files: list[str], schema, io_properties: dict):
    from airflow_provider_logbus.schema import ddl_type
    from airflow_provider_logbus.spark.parquet_writer import STORAGE_OPTION, ParquetDataSource, storage_option

    spark.dataSource.register(ParquetDataSource)
    ddl = ", ".join(f"`{f.name}` {ddl_type(f.type)}" for f in schema)
    return (spark.read.format("logbus-parquet").schema(ddl).option("paths", json.dumps(files))
            .option(STORAGE_OPTION, storage_option(Storage(io_properties))).load())
