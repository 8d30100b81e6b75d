"""The load job's writer, the `logbus-parquet` data source (pyarrow on the executors):
the same rows and partition directories as Spark's own Parquet writer, counts that equal
counting the files, the timestamp encoding each layout needs, rejected rows split off
into `_rejects/` in the same pass, and no file left by a task attempt that failed after
writing (a real task retried on a local[2,2] master, the failure injected into the
writer after it wrote rows and rejects)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_logbus.spark.load_job import write_parquet
from airflow_provider_logbus.spark.parquet_writer import WRITTEN_FILE
from airflow_provider_logbus.staged import count_windows

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.slow
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def frame(spark, n: int = 3000):
    from pyspark.sql import functions as F

    return (spark.range(n).repartition(3)
            .select(F.when(F.col("id") % 2 == 0, "a").otherwise("b").alias("topic"),
                    (F.col("id") % 4).cast("int").alias("partition"), F.col("id").alias("offset"),
                    F.timestamp_micros(F.lit(int(T0.timestamp() * 1e6)) + F.col("id") * 1_000_000).alias("timestamp"),
                    F.lit(None).cast("binary").alias("key"), (F.col("id") * 3).alias("n"))
            .withColumn("logbus_hour", F.floor(F.unix_micros("timestamp") / 3_600_000_000).cast("int")))


def rows_of(path: Path) -> list[tuple]:
    import pyarrow.dataset as ds

    table = ds.dataset(path, format="parquet", partitioning="hive").to_table(
        columns=["topic", "partition", "offset", "n", "logbus_hour"])
    return sorted(zip(*(table[c].to_pylist() for c in table.column_names)))


def test_the_writer_writes_what_sparks_parquet_writer_writes_and_counts_it(spark, tmp_path):
    df = frame(spark)
    written = write_parquet(df, str(tmp_path / "ours"), ["logbus_hour"])
    df.write.partitionBy("logbus_hour").parquet(str(tmp_path / "spark"))

    assert rows_of(tmp_path / "ours") == rows_of(tmp_path / "spark")
    assert {p.parent.name for p in (tmp_path / "ours").rglob("*.parquet")} == {
        p.parent.name for p in (tmp_path / "spark").rglob("*.parquet")} == {"logbus_hour=473352"}
    files = sorted((tmp_path / "ours").rglob("*.parquet"))
    assert sorted(f["path"] for f in written["files"]) == [str(p) for p in files]
    assert (written["counts"], written["row_count"]) == count_windows(files)
    assert written["row_count"] == 3000 and sum(f["rows"] for f in written["files"]) == 3000
    column = pq.ParquetFile(files[0]).schema.column(3)  # timestamp
    assert column.physical_type == "INT64" and "microseconds" in str(column.logical_type)  # what Iceberg reads


def test_the_directory_layout_keeps_sparks_int96_timestamps_and_date_partitions(spark, tmp_path):
    from pyspark.sql import functions as F

    df = frame(spark, 100).drop("logbus_hour").withColumn("event_date", F.to_date("timestamp")).withColumn(
        "event_hour", F.hour("timestamp"))
    write_parquet(df, str(tmp_path / "ours"), ["event_date", "event_hour"], int96=True)
    df.write.partitionBy("event_date", "event_hour").parquet(str(tmp_path / "spark"))
    ours = sorted(p.relative_to(tmp_path / "ours").parent for p in (tmp_path / "ours").rglob("*.parquet"))
    theirs = sorted(p.relative_to(tmp_path / "spark").parent for p in (tmp_path / "spark").rglob("*.parquet"))
    assert set(ours) == set(theirs) == {Path("event_date=2024-01-01/event_hour=0")}
    assert pq.ParquetFile(next((tmp_path / "ours").rglob("*.parquet"))).schema.column(3).physical_type == "INT96"
    back = spark.read.parquet(str(tmp_path / "ours")).orderBy("offset").collect()
    assert [r.timestamp.replace(tzinfo=None) for r in back][:2] == [
        r.timestamp.replace(tzinfo=None) for r in df.orderBy("offset").collect()][:2]


def test_an_empty_frame_writes_no_file_and_counts_nothing(spark, tmp_path):
    written = write_parquet(frame(spark).limit(0), str(tmp_path / "empty"), ["logbus_hour"])
    assert written["files"] == [] and written["row_count"] == 0
    assert not list((tmp_path / "empty").rglob("*.parquet")) and (tmp_path / "empty" / WRITTEN_FILE).exists()


def test_rows_marked_rejected_go_to_rejects_in_the_same_pass_and_are_counted_apart(spark, tmp_path):
    from pyspark.sql import functions as F

    df = frame(spark).withColumn("_logbus_reject", F.when(F.col("offset") % 7 == 0, F.struct(
        "topic", "offset", "timestamp", F.lit("bad value").alias("error"))))
    written = write_parquet(df, str(tmp_path / "out"), ["logbus_hour"], reject_column="_logbus_reject")

    rejected = {o for o in range(3000) if o % 7 == 0}
    rejects = pq.read_table(tmp_path / "out" / "_rejects")
    assert rejects.column_names == ["topic", "offset", "timestamp", "error"]
    assert sorted(rejects["offset"].to_pylist()) == sorted(rejected)
    assert set(rejects["error"].to_pylist()) == {"bad value"}
    data = sorted(p for p in (tmp_path / "out").rglob("*.parquet") if p.parent.name != "_rejects")
    accepted = pq.read_table([str(p) for p in data])
    assert "_logbus_reject" not in accepted.column_names
    assert sorted(accepted["offset"].to_pylist()) == sorted(set(range(3000)) - rejected)
    assert (written["counts"], written["row_count"]) == count_windows(data)
    assert (written["rejected"], written["rejected_count"]) == count_windows(
        sorted((tmp_path / "out" / "_rejects").glob("*.parquet")))
    assert written["rejected_count"] == len(rejected)
    assert sorted(f["path"] for f in written["rejected_files"]) == sorted(
        str(p) for p in (tmp_path / "out" / "_rejects").glob("*.parquet"))


def test_the_reject_options_come_together_or_not_at_all(tmp_path):
    from airflow_provider_logbus.spark.parquet_writer import ParquetWriter

    with pytest.raises(ValueError, match="both options 'rejects' and 'reject_column'"):
        ParquetWriter({"path": str(tmp_path), "rejects": "_rejects"})


RETRIED = """
import json, sys
from pyspark.sql import SparkSession
from pyspark import TaskContext
sys.path.insert(0, sys.argv[2])
from airflow_provider_logbus.spark.parquet_writer import ParquetDataSource, ParquetWriter, read_written

class FailingWriter(ParquetWriter):  # defined in __main__: shipped to the executors by value
    def write(self, iterator):
        ctx = TaskContext.get()
        def batches():
            for i, batch in enumerate(iterator):
                yield batch
                if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and i == 3:
                    raise RuntimeError("task attempt killed after writing")
        return super().write(batches())

class FailingSource(ParquetDataSource):
    @classmethod
    def name(cls):
        return "logbus-parquet-failing"
    def writer(self, schema, overwrite):
        return FailingWriter(self.options)

spark = (SparkSession.builder.master("local[2,2]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100").getOrCreate())
spark.dataSource.register(FailingSource)
df = spark.range(2000).repartition(2).selectExpr(
    "'t' as topic", "cast(id % 2 as int) as partition", "id as offset",
    "timestamp_micros(1704067200000000 + id) as timestamp", "cast(null as binary) as key",
    "CASE WHEN id % 10 = 0 THEN named_struct('topic', 't', 'offset', id, "
    "'timestamp', timestamp_micros(1704067200000000 + id)) END AS rejected")
(df.write.format("logbus-parquet-failing").mode("append").option("path", sys.argv[1])
 .option("rejects", "_rejects").option("reject_column", "rejected").save())
print(json.dumps(read_written(sys.argv[1])))
spark.stop()
"""


def test_a_task_attempt_that_failed_after_writing_leaves_no_file(tmp_path):
    out = subprocess.run([sys.executable, "-c", RETRIED, str(tmp_path / "out"), str(ROOT)], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "task attempt killed after writing" in out.stderr  # the first attempt did fail
    written = json.loads(out.stdout.strip().splitlines()[-1])
    files = sorted((tmp_path / "out").rglob("*.parquet"))
    assert [str(p) for p in files] == sorted(f["path"] for f in written["files"] + written["rejected_files"])
    rejects = [p for p in files if p.parent.name == "_rejects"]
    offsets = pq.read_table([str(p) for p in files if p not in rejects], columns=["offset"])["offset"].to_pylist()
    rejected = pq.read_table([str(p) for p in rejects], columns=["offset"])["offset"].to_pylist()
    assert sorted(offsets) == [i for i in range(2000) if i % 10] and written["row_count"] == 1800
    assert sorted(rejected) == list(range(0, 2000, 10)) and written["rejected_count"] == 200
