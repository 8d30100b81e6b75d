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
       .option("rejects", "_rejects")               # optional: rows whose column `_logbus_reject`
       .option("reject_column", "_logbus_reject")   #   is not null go there, as that struct's fields
       .save())

With `rejects`, one pass writes both outputs of the load job: a row whose reject column
is null is accepted (written without that column, into the partition directories), any
other row is written as the struct's fields alone to `<path>/<rejects>/part-*.parquet`,
unpartitioned. So the decoded rows are never cached for a second pass over them.

Every task writes one file per partition value into `<path>/<col>=<value>/part-<task>-<uuid>.parquet`
and reports its files, rows and counts in its commit message; the driver's commit
deletes any file under `<path>` no message names (a task attempt that failed after
writing), then writes `<path>/_logbus_written.json`:

    {"files": [{"path", "rows"}], "row_count": N, "counts": [{"topic", "window_start", "count"}],
     "rejected_files": [...], "rejected_count": R, "rejected": [{"topic", "window_start", "count"}]}

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

from airflow_provider_logbus.staged import COUNT_WINDOW_MS, add_window_counts, window_rows
from airflow_provider_logbus.storage import Storage, join

WRITTEN_FILE = "_logbus_written.json"


STORAGE_OPTION = "secret_storage"


def storage_option(storage: Storage) -> str:
    return json.dumps(storage.properties)


@dataclass
class WrittenFiles(WriterCommitMessage):
    """One task's output: its files (path inside the filesystem, rows) and its counts,
    of accepted rows and of rejects."""

    files: list[tuple[str, int]] = field(default_factory=list)
    counts: dict[tuple[str, int], int] = field(default_factory=dict)
    rejected_files: list[tuple[str, int]] = field(default_factory=list)
    rejected: dict[tuple[str, int], int] = field(default_factory=dict)


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
        self.rejects = options.get("rejects") or None
        self.reject_column = options.get("reject_column") or None
        if bool(self.rejects) != bool(self.reject_column):
            raise ValueError("the logbus-parquet writer needs both options 'rejects' and 'reject_column', or neither")

    def write(self, iterator: Iterator) -> WrittenFiles:
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        context = TaskContext.get()
        task = f"{context.partitionId():05d}" if context is not None else "00000"
        files = _TaskFiles(self.storage, self.location, task, self.int96)
        rejects = _TaskFiles(self.storage, join(self.location, self.rejects), task, self.int96) if self.rejects \
            else None
        out = WrittenFiles()
        try:
            for batch in iterator:
                table = pa.Table.from_batches([batch])
                if table.num_rows == 0:
                    continue
                if rejects is not None:
                    marks = table[self.reject_column]
                    if marks.null_count < table.num_rows:
                        rejected = pa.Table.from_struct_array(marks.filter(pc.is_valid(marks)))
                        add_window_counts(rejected, self.window_ms, out.rejected)
                        rejects.write("", rejected)
                        table = table.filter(pc.is_null(marks))
                    table = table.drop_columns([self.reject_column])
                add_window_counts(table, self.window_ms, out.counts)
                for directory, part in self._split(table):
                    files.write(directory, part)
        finally:
            files.close()
            if rejects is not None:
                rejects.close()
        out.files = files.written()
        out.rejected_files = rejects.written() if rejects is not None else []
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
        messages = [m for m in messages if m is not None]
        files = [f for m in messages for f in m.files]
        rejected_files = [f for m in messages for f in m.rejected_files]
        named = {path for path, _ in files + rejected_files}
        for info in fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True)):
            if info.type == FileType.File and info.path.endswith(".parquet") and info.path not in named:
                fs.delete_file(info.path)  # written by a task attempt that failed afterwards
        counts = _summed(m.counts for m in messages)
        rejected = _summed(m.rejected for m in messages)
        written = {"files": _listed(files), "row_count": sum(counts.values()), "counts": window_rows(counts),
                   "rejected_files": _listed(rejected_files), "rejected_count": sum(rejected.values()),
                   "rejected": window_rows(rejected), "window_ms": self.window_ms}
        self.storage.make_dirs(self.location)
        with fs.open_output_stream(f"{root.rstrip('/')}/{WRITTEN_FILE}") as stream:
            stream.write(json.dumps(written, sort_keys=True).encode())

    def abort(self, messages: list[WrittenFiles]) -> None:
        fs, _ = self.storage.resolve(self.location)
        for m in messages:
            for path, _ in (m.files + m.rejected_files if m is not None else ()):
                try:
                    fs.delete_file(path)
                except FileNotFoundError:
                    pass


class _TaskFiles:
    """One task's open Parquet files, one per directory under the location."""

    def __init__(self, storage: Storage, location: str, task: str, int96: bool) -> None:
        self.storage, self.location, self.task, self.int96 = storage, location, task, int96
        self.fs, self.root = storage.resolve(location)
        self.open: dict[str, tuple] = {}  # directory -> (pq.ParquetWriter, path, [rows])

    def write(self, directory: str, part) -> None:
        import pyarrow.parquet as pq

        if directory not in self.open:
            path = f"{self.root.rstrip('/')}/{directory}part-{self.task}-{uuid.uuid4().hex}.parquet"
            self.storage.make_dirs(self.storage.location_of(self.location, path.rsplit("/", 1)[0]))
            writer = pq.ParquetWriter(self.fs.open_output_stream(path), part.schema,
                                      use_deprecated_int96_timestamps=self.int96)
            self.open[directory] = (writer, path, [0])
        writer, _, rows = self.open[directory]
        writer.write_table(part)
        rows[0] += part.num_rows

    def close(self) -> None:
        for writer, _, _ in self.open.values():
            writer.close()

    def written(self) -> list[tuple[str, int]]:
        """(path, rows) of every file written."""
        return [(path, rows[0]) for _, path, rows in self.open.values()]


def _summed(counts) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for c in counts:
        for key, n in c.items():
            out[key] = out.get(key, 0) + n
    return out


def _listed(files: list[tuple[str, int]]) -> list[dict]:
    return [{"path": p, "rows": n} for p, n in sorted(files)]


def _partition_text(value) -> str:
    """A partition value as Spark's partitionBy writes it in a directory name."""
    if value is None:
        return "__HIVE_DEFAULT_PARTITION__"
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def read_written(location: str, storage: Storage | None = None) -> dict:
    """The driver's record of what a `logbus-parquet` write produced (module docstring)."""
    return (storage or Storage()).read_json(f"{location.rstrip('/')}/{WRITTEN_FILE}")
