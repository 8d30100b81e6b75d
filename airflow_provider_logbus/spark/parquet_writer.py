"""The Spark Python data source `logbus-parquet`: the load job's writer. Executors write
Parquet with pyarrow through `pyarrow.fs` — a local path, or `s3://`, `gs://`, `abfs://`
where pyarrow reaches them — so a load needs no Hadoop filesystem jar, and each task
counts the rows it wrote per (topic, 10-minute window of the message timestamp), so the
load never reads its own output back to count it.

    spark.dataSource.register(ParquetDataSource)
    (df.write.format("logbus-parquet").mode("append")
       .option("path", "/wh/tbl/_staging/b.1")      # a directory, or s3://bucket/prefix
       .option("partition_by", "logbus_hour")       # Hive-style directories, as partitionBy writes them
       .option("int96", "false")                    # TIMESTAMP_MICROS (Iceberg); "true": Spark's INT96
       .save())

Every task writes one file per partition value into `<path>/<col>=<value>/part-<task>-<uuid>.parquet`
and reports its files, rows and counts in its commit message; the driver's commit
deletes any file under `<path>` no message names (a task attempt that failed after
writing), then writes `<path>/_logbus_written.json`:

    {"files": [{"path", "rows"}], "row_count": N, "counts": [{"topic", "window_start", "count"}]}

A job that fails has its tasks' files deleted by `abort`; the staging directory is the
attempt's own and is removed by the commit protocol in any case. Object-store settings
(`storage.py`) travel in the option `secret_storage` (JSON), named to match Spark's
default `spark.redaction.regex` (`secret`), the rule Spark applies where it shows options.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceReader, InputPartition, \
    WriterCommitMessage

from airflow_provider_logbus.staged import COUNT_WINDOW_MS, add_window_counts
from airflow_provider_logbus.storage import Storage

WRITTEN_FILE = "_logbus_written.json"


STORAGE_OPTION = "secret_storage"


def storage_option(storage: Storage) -> str:
    return json.dumps(storage.properties)


@dataclass
class WrittenFiles(WriterCommitMessage):
    """One task's output: its files (path inside the filesystem, rows) and its counts."""

    files: list[tuple[str, int]] = field(default_factory=list)
    counts: dict[tuple[str, int], int] = field(default_factory=dict)


class ParquetDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "logbus-parquet"

    def writer(self, schema, overwrite: bool) -> "ParquetWriter":
        return ParquetWriter(self.options)

    def reader(self, schema) -> "ParquetReader":
        return ParquetReader(self.options, schema)


class FilePartition(InputPartition):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class ParquetReader(DataSourceReader):
    """Reads the Parquet files named in option `paths` (a JSON list of locations), one
    input partition per file, through `pyarrow.fs`: what Spark's own reader cannot do on
    an object store without Hadoop's connector. Columns the schema names and a file lacks
    are null (a field added by schema evolution)."""

    def __init__(self, options: dict, schema) -> None:
        self.paths = json.loads(options["paths"])
        self.columns = [f.name for f in schema.fields]
        self.storage = Storage(json.loads(options.get(STORAGE_OPTION) or "{}"))

    def partitions(self) -> list[FilePartition]:
        return [FilePartition(p) for p in self.paths]

    def read(self, partition: FilePartition) -> Iterator:
        import pyarrow as pa

        table = self.storage.read_parquet(partition.path)
        for batch in table.to_batches():
            yield pa.RecordBatch.from_arrays(
                [batch.column(c) if c in batch.schema.names else pa.nulls(batch.num_rows) for c in self.columns],
                names=self.columns)


class ParquetWriter(DataSourceArrowWriter):
    def __init__(self, options: dict) -> None:
        self.location = options["path"]
        self.partition_by = [c for c in options.get("partition_by", "").split(",") if c]
        self.int96 = options.get("int96", "false") == "true"
        self.window_ms = int(options.get("window_ms", COUNT_WINDOW_MS))
        self.storage = Storage(json.loads(options.get(STORAGE_OPTION) or "{}"))

    def write(self, iterator: Iterator) -> WrittenFiles:
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        context = TaskContext.get()
        task = f"{context.partitionId():05d}" if context is not None else "00000"
        fs, root = self.storage.resolve(self.location)
        writers: dict[str, tuple[pq.ParquetWriter, str, list[int]]] = {}
        out = WrittenFiles()
        try:
            for batch in iterator:
                table = pa.Table.from_batches([batch])
                if table.num_rows == 0:
                    continue
                add_window_counts(table, self.window_ms, out.counts)
                for directory, part in self._split(table):
                    if directory not in writers:
                        path = f"{root.rstrip('/')}/{directory}part-{task}-{uuid.uuid4().hex}.parquet"
                        self.storage.make_dirs(self.storage.location_of(self.location, path.rsplit("/", 1)[0]))
                        writer = pq.ParquetWriter(fs.open_output_stream(path), part.schema,
                                                  use_deprecated_int96_timestamps=self.int96)
                        writers[directory] = (writer, path, [0])
                    writer, _, rows = writers[directory]
                    writer.write_table(part)
                    rows[0] += part.num_rows
        finally:
            for writer, _, _ in writers.values():
                writer.close()
        out.files = [(path, rows[0]) for _, path, rows in writers.values()]
        return out

    def _split(self, table):
        """(Hive-style directory, rows without the partition columns) per partition value."""
        import pyarrow.compute as pc

        if not self.partition_by:
            yield "", table
            return
        data = table.drop_columns(self.partition_by)
        keys = table.select(self.partition_by).group_by(self.partition_by).aggregate([])
        for values in keys.to_pylist():
            mask = None
            for column in self.partition_by:
                here = pc.equal(table[column], values[column]) if values[column] is not None else pc.is_null(
                    table[column])
                mask = here if mask is None else pc.and_(mask, here)
            directory = "".join(f"{c}={_partition_text(values[c])}/" for c in self.partition_by)
            yield directory, data.filter(mask)

    def commit(self, messages: list[WrittenFiles]) -> None:
        from pyarrow.fs import FileSelector, FileType

        fs, root = self.storage.resolve(self.location)
        files = [f for m in messages if m is not None for f in m.files]
        named = {path for path, _ in files}
        for info in fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True)):
            if info.type == FileType.File and info.path.endswith(".parquet") and info.path not in named:
                fs.delete_file(info.path)  # written by a task attempt that failed afterwards
        counts: dict[tuple[str, int], int] = {}
        for m in messages:
            for key, n in (m.counts if m is not None else {}).items():
                counts[key] = counts.get(key, 0) + n
        written = {"files": [{"path": p, "rows": n} for p, n in sorted(files)], "row_count": sum(counts.values()),
                   "counts": [{"topic": t, "window_start": w, "count": n} for (t, w), n in sorted(counts.items())],
                   "window_ms": self.window_ms}
        self.storage.make_dirs(self.location)
        with fs.open_output_stream(f"{root.rstrip('/')}/{WRITTEN_FILE}") as stream:
            stream.write(json.dumps(written, sort_keys=True).encode())

    def abort(self, messages: list[WrittenFiles]) -> None:
        fs, _ = self.storage.resolve(self.location)
        for m in messages:
            for path, _ in (m.files if m is not None else ()):
                try:
                    fs.delete_file(path)
                except FileNotFoundError:
                    pass


def _partition_text(value) -> str:
    """A partition value as Spark's partitionBy writes it in a directory name."""
    if value is None:
        return "__HIVE_DEFAULT_PARTITION__"
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def read_written(location: str, storage: Storage | None = None) -> dict:
    """The driver's record of what a `logbus-parquet` write produced (module docstring)."""
    return (storage or Storage()).read_json(f"{location.rstrip('/')}/{WRITTEN_FILE}")
