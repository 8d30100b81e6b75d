"""Benchmark (issue 8): the two exactly-once targets side by side — Parquet directories
(`DirectoryTarget`, one rename per batch) and Apache Iceberg (`IcebergTarget`, one
snapshot per batch, embedded SQLite catalog).

    .venv/bin/python -m bench.iceberg                      # all three parts
    .venv/bin/python -m bench.iceberg --part load --messages 500000 --repeat 2
    .venv/bin/python -m bench.iceberg --part commit --files 10,100,1000
    .venv/bin/python -m bench.iceberg --part year --snapshots 168,360,720

Parts:

* **load** — N messages of 200-byte JSON in a 2-partition topic on one local broker
  (producing not timed), then per target the whole batch path in this process:
  `plan_batch` → `ensure_schema` + `prepare_staging` → `run_load` (Spark, `local[*]`,
  layout of the target) → `target.commit`. Spark and both targets are warmed up first
  with a small batch through each.
* **commit** — `target.commit` alone against the number of staged data files (small
  files of 100 rows written with pyarrow in each target's staging layout), and for
  Iceberg the metadata that commit wrote and where its time went (`Phases`: footers
  read by `add_files`, its duplicate check, the catalog's compare-and-swap).
* **year** — what a year of hourly batches costs a reader of one hour. Directory: 8,760
  `batch_id=<hour>/event_date=<d>/event_hour=<h>/part-0.parquet` trees (with their batch
  records); a reader of one hour with pyarrow and Spark (cancelled after
  `--spark-timeout`), the directories and files it must list, and the commit of the
  next batch. Iceberg: K hourly snapshots (one file
  each) committed through `IcebergTarget.commit`; at each checkpoint the scan planning
  of one hour, the manifests listed and opened, the metadata sizes; a linear
  extrapolation to 8,760; then snapshot expiry and a manifest-merging append.

Nothing here asserts a time. Results are printed as Markdown and written to
`bench/results/iceberg-<part>.{csv,json,md}` (git-ignored; `--results DIR` elsewhere).
ZooKeeper, the broker and one Spark JVM for all parts run only meanwhile, in a scratch
directory, and are stopped on the way out, also on failure (exit status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.spark_load import ENTRY, HOUR_MS, SCHEMA, produce  # noqa: E402
from harness.cluster import LocalCluster  # noqa: E402
from harness.spark import local_session  # noqa: E402
from harness.zookeeper import ZooKeeperServer  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
YEAR_START = datetime(2025, 1, 1, tzinfo=timezone.utc)
HOURS_PER_YEAR = 8_760
ROWS_PER_SMALL_FILE = 100
ROWS_PER_HOUR_FILE = 5
READER_RUNS = 3  # a reader of one hour is cheap: measured three times, the fastest counts

logger = logging.getLogger("bench.iceberg")


# ------------------------------------------------------------------ small helpers


def loadavg() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def markdown(title: str, rows: list[dict], columns: list[str]) -> str:
    def cell(v) -> str:
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    lines = [f"### {title}", "", "| " + " | ".join(columns) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_results(results: Path, name: str, rows: list[dict]) -> None:
    results.mkdir(parents=True, exist_ok=True)
    if not rows:
        return
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(results / f"iceberg-{name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def value_schema():
    from airflow_provider_logbus.schema import load_schema

    return load_schema(SCHEMA).to_arrow()


def table_schema():
    """The columns the load job writes (and the Iceberg table holds), with their types."""
    import pyarrow as pa

    from airflow_provider_logbus.targets.iceberg_tables import logbus_columns

    return pa.schema([*logbus_columns(), *value_schema()])


def rows_table(first: int, n: int, hour_ms: int):
    """Rows for messages `first` .. `first + n - 1` of one hour: message j goes to
    partition j % 2 at offset (j // 2) * ENTRY, stamped inside the hour."""
    import pyarrow as pa

    js = range(first, first + n)
    stamps = [hour_ms + (j * 7919) % HOUR_MS for j in js]
    return pa.table({
        "topic": pa.array(["bench"] * n, pa.string()),
        "partition": pa.array([j % 2 for j in js], pa.int32()),
        "offset": pa.array([(j // 2) * ENTRY for j in js], pa.int64()),
        "timestamp": pa.array(stamps, pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
        "key": pa.array([None] * n, pa.binary()),
        "headers": pa.array([[]] * n, table_schema().field("headers").type),  # native messages: none
        "server": pa.array([f"web-{j % 3}" for j in js], pa.string()),
        "n": pa.array(list(js), pa.int64()),
        "ts_ms": pa.array(stamps, pa.int64()),
        "page": pa.array([f"/p/{j % 997}" for j in js], pa.string()),
        "pad": pa.array(["x" * 100] * n, pa.string()),
    }, schema=table_schema())


def hour_directory(layout: str, hour_ms: int) -> str:
    """The partition directory of one hour in a staging layout (as `load_job` writes it)."""
    if layout == "directory":
        h = datetime.fromtimestamp(hour_ms / 1000, timezone.utc)
        return f"event_date={h:%Y-%m-%d}/event_hour={h.hour}"
    return f"logbus_hour={hour_ms // HOUR_MS}"


def ranges_for(first: int, count: int) -> list:
    """The byte ranges holding messages `first` .. `first + count - 1` (see `rows_table`)."""
    from airflow_provider_logbus.plan import Range

    out = []
    last = first + count - 1
    for p in (0, 1):
        low = first if first % 2 == p else first + 1
        high = last if last % 2 == p else last - 1
        if low <= high:
            out.append(Range("bench", p, (low // 2) * ENTRY, (high // 2 + 1) * ENTRY))
    return out


def write_staging(staging: Path, layout: str, files: int, rows_per_file: int, first: int, first_hour_ms: int,
                  hours: int) -> list:
    """`files` Parquet files of `rows_per_file` rows spread over `hours` hours, in the
    target's staging layout, with `_logbus_counts.json` (as the load job writes it).
    Returns the ranges they hold."""
    import pyarrow.parquet as pq

    from airflow_provider_logbus.staged import COUNTS_FILE, count_windows

    staging.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(files):
        hour_ms = first_hour_ms + (i % hours) * HOUR_MS
        directory = staging / hour_directory(layout, hour_ms)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(rows_table(first + i * rows_per_file, rows_per_file, hour_ms), path)
        paths.append(path)
    counts, n = count_windows(paths)
    (staging / COUNTS_FILE).write_text(json.dumps({
        "counts": counts, "row_count": n, "window_ms": 600_000, "rejected": [], "rejected_count": 0,
        "schema": SCHEMA, "schema_source": "declared", "layout": layout, "format": "json"}))
    return ranges_for(first, files * rows_per_file)


def plan_of(table: str, hour: datetime, ranges: list):
    from airflow_provider_logbus.plan import BatchPlan, batch_id_for

    end = hour + timedelta(hours=1)
    return BatchPlan(batch_id=batch_id_for(hour, end), table=table, topic="bench", interval_start=hour.isoformat(),
                     interval_end=end.isoformat(), ranges=tuple(ranges))


def open_kind(kind: str, warehouse: Path, table: str):
    from airflow_provider_logbus.targets.directory import DirectoryTarget
    from airflow_provider_logbus.targets.iceberg import IcebergTarget

    if kind == "directory":
        return DirectoryTarget(warehouse, table)
    return IcebergTarget(table, warehouse=str(warehouse))


def metadata_files(target) -> dict[str, int]:
    """Every file under the Iceberg table's metadata/ directory, with its size."""
    from airflow_provider_logbus.targets.iceberg_tables import local_path

    root = Path(local_path(target.table_or_fail().location())) / "metadata"
    return {str(p): p.stat().st_size for p in root.iterdir()} if root.is_dir() else {}


# ------------------------------------------------------------------ part 1: load


def one_batch(spark, cluster, zookeeper: str, target, topic: str, hour: datetime) -> dict:
    from airflow_provider_logbus.batch import plan_batch
    from airflow_provider_logbus.spark.load_job import run_load
    from airflow_provider_logbus.staged import StagedBatch

    t0 = time.perf_counter()
    plan = plan_batch(cluster, target, topic, hour, hour + timedelta(hours=1))
    t1 = time.perf_counter()
    target.ensure_schema(value_schema())
    staging = target.prepare_staging(plan.batch_id, 1)
    t2 = time.perf_counter()
    result = run_load(spark, plan.ranges, staging, zookeeper=zookeeper, value_format="json",
                      schema=SCHEMA, layout=target.layout)
    t3 = time.perf_counter()
    files = len(StagedBatch.read(staging).data_files())  # not timed
    t3b = time.perf_counter()
    committed = target.commit(plan, staging, "bench")
    t4 = time.perf_counter()
    if committed.record.row_count != result["row_count"] or not committed.published_now:
        raise RuntimeError(f"{target!r}: committed {committed.record.row_count} rows of {result['row_count']}")
    return {"plan_s": t1 - t0, "schema_staging_s": t2 - t1, "load_s": t3 - t2, "commit_s": t4 - t3b,
            "total_s": (t4 - t3b) + (t3 - t0), "rows": committed.record.row_count, "files": files}


def part_load(args, work: Path, spark, local) -> list[dict]:
    """Part 1 on `spark` and `local` (a `LocalCluster` whose broker starts here)."""
    from airflow_provider_logbus.cluster import LogbusCluster
    from broker.client.connection import BrokerConnection
    from harness.process import wait_until

    rows: list[dict] = []
    connect = local.zookeeper
    broker = local.start_broker(0)
    # closed also on failure: its ZooKeeper watches would retry for ever at exit
    with BrokerConnection(*broker.address) as conn, LogbusCluster(connect) as cluster:
        for topic, count in (("warm", 2_000), ("bench", args.messages)):
            conn.create_topic(topic, 2)
            wait_until(lambda t=topic: len(cluster.partitions(t)) == 2, 30, f"topic {topic}")
            produce(conn, topic, count)
            wait_until(lambda t=topic, c=count: sum(cluster.latest(t, p) for p in (0, 1)) == c * ENTRY,
                       60, f"flush of {topic}")
        print(f"{args.messages:,} messages in topic bench ({args.messages * ENTRY / 1e6:.0f} MB); "
              f"load average {loadavg()}", flush=True)
        hour = datetime(2025, 1, 1, tzinfo=timezone.utc)
        for kind in ("directory", "iceberg"):  # warm-up: JVM, Python workers, both layouts, catalog
            one_batch(spark, cluster, connect, open_kind(kind, work / f"wh-{kind}", f"warm_{kind}"), "warm",
                      hour)
        for rep in range(args.repeat):
            kinds = ("directory", "iceberg") if rep % 2 == 0 else ("iceberg", "directory")
            for kind in kinds:
                target = open_kind(kind, work / f"wh-{kind}", f"bench_{kind}_{rep}")
                row = {"run": rep + 1, "target": kind, "messages": args.messages,
                       **one_batch(spark, cluster, connect, target, "bench", hour)}
                target.close()
                row["rows_per_s"] = row["rows"] / row["total_s"]
                row["loadavg"] = loadavg()
                rows.append(row)
                print(f"  run {rep + 1} {kind:<9} load {row['load_s']:6.1f} s  commit {row['commit_s']:6.3f} s"
                      f"  total {row['total_s']:6.1f} s  {row['files']} files  load avg {row['loadavg']}",
                      flush=True)
    for rep in range(args.repeat):
        pair = {r["target"]: r for r in rows if r["run"] == rep + 1}
        for key in ("load_s", "commit_s", "total_s"):
            pair["iceberg"][f"{key}_ratio_to_directory"] = pair["iceberg"][key] / pair["directory"][key]
    return rows


# ------------------------------------------------------------------ part 2: commit


class Phases:
    """Times three steps inside an Iceberg commit by wrapping pyiceberg's functions:
    `footers` (add_files reads every file's Parquet footer for its statistics and
    partition), `duplicate_check` (add_files opens every data manifest of the current
    snapshot to refuse files already in the table) and `catalog_commit` (the catalog's
    compare-and-swap, which writes the new metadata.json). The rest of a commit is the
    target's reads of the table and pyiceberg's own bookkeeping (the transaction copies
    the table metadata for every update) and the manifest and manifest list writes."""

    def __init__(self) -> None:
        import pyiceberg.table as table_module
        from pyiceberg.catalog.sql import SqlCatalog

        self.seconds = {"footers": 0.0, "duplicate_check": 0.0, "catalog_commit": 0.0}
        self.patches = [(table_module, "_parquet_files_to_data_files", "footers"),
                        (table_module.Transaction, "_find_referenced_data_files", "duplicate_check"),
                        (SqlCatalog, "commit_table", "catalog_commit")]
        self.saved: list = []

    def __enter__(self) -> "Phases":
        for owner, name, phase in self.patches:
            real = owner.__dict__[name]
            self.saved.append((owner, name, real))

            def timed(*args, _real=real, _phase=phase, **kwargs):
                t0 = time.perf_counter()
                try:
                    return _real(*args, **kwargs)
                finally:
                    self.seconds[_phase] += time.perf_counter() - t0

            setattr(owner, name, timed)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, real in self.saved:
            setattr(owner, name, real)


def part_commit(args, work: Path) -> list[dict]:
    rows = []
    hour = datetime(2025, 3, 1, tzinfo=timezone.utc)
    first_hour_ms = int(hour.timestamp() * 1000)
    for files in args.files:
        for rep in range(args.repeat):
            kinds = ("directory", "iceberg") if rep % 2 == 0 else ("iceberg", "directory")
            for kind in kinds:
                target = open_kind(kind, work / f"wh-commit-{kind}", f"c{files}_{rep}")
                target.ensure_schema(value_schema())
                staging = Path(target.prepare_staging("b", 1))
                ranges = write_staging(staging, target.layout, files, ROWS_PER_SMALL_FILE, 0, first_hour_ms, 24)
                plan = plan_of(target.table, hour, ranges)
                before = metadata_files(target) if kind == "iceberg" else {}
                with Phases() as phases:
                    t0 = time.perf_counter()
                    result = target.commit(plan, str(staging), "bench")
                    elapsed = time.perf_counter() - t0
                row = {"files": files, "run": rep + 1, "target": kind, "commit_s": elapsed,
                       "rows": result.record.row_count}
                if kind == "iceberg":
                    new = {p: s for p, s in metadata_files(target).items() if p not in before}
                    row["metadata_json_bytes"] = sum(s for p, s in new.items() if p.endswith(".metadata.json"))
                    row["manifest_list_bytes"] = sum(s for p, s in new.items() if Path(p).name.startswith("snap-"))
                    row["manifest_bytes"] = sum(s for p, s in new.items()
                                                if p.endswith(".avro") and not Path(p).name.startswith("snap-"))
                    row["metadata_files_written"] = len(new)
                    row.update({f"{k}_s": v for k, v in phases.seconds.items()})
                    row["other_s"] = elapsed - sum(phases.seconds.values())
                row["loadavg"] = loadavg()
                target.close()
                rows.append(row)
                print(f"  {files:>5} files  run {rep + 1}  {kind:<9} commit {elapsed:7.3f} s"
                      + (f"  (footers {row['footers_s']:.3f} s, duplicate check {row['duplicate_check_s']:.3f} s, catalog "
                         f"{row['catalog_commit_s']:.3f} s, metadata {row['metadata_json_bytes']:,} + "
                         f"{row['manifest_list_bytes']:,} + {row['manifest_bytes']:,} bytes)"
                         if kind == "iceberg" else "") + f"  load avg {row['loadavg']}", flush=True)
    return rows


# ------------------------------------------------------------------ part 3: a year


def walk_counts(root: Path) -> tuple[int, int]:
    """(directories, files) under `root`, itself included: what a recursive lister reads
    (one directory listing per directory)."""
    dirs = files = 0
    for _, dirnames, filenames in os.walk(root):
        dirs += 1
        files += len(filenames)
    return dirs, files


def build_directory_year(target, hours: int) -> None:
    """`hours` published hourly batches, as the load job and the commit leave them."""
    import pyarrow.parquet as pq

    from airflow_provider_logbus.staged import count_windows
    from airflow_provider_logbus.targets.base import BatchRecord
    from airflow_provider_logbus.targets.directory import BATCH_RECORD

    for h in range(hours):
        hour = YEAR_START + timedelta(hours=h)
        hour_ms = int(hour.timestamp() * 1000)
        plan = plan_of(target.table, hour, ranges_for(h * ROWS_PER_HOUR_FILE, ROWS_PER_HOUR_FILE))
        batch = target.batch_dir(plan.batch_id)
        directory = batch / hour_directory("directory", hour_ms)
        directory.mkdir(parents=True)
        path = directory / "part-00000.parquet"
        pq.write_table(rows_table(h * ROWS_PER_HOUR_FILE, ROWS_PER_HOUR_FILE, hour_ms), path)
        counts, n = count_windows([path])
        record = BatchRecord(table=target.table, batch_id=plan.batch_id, interval_start=plan.interval_start,
                             interval_end=plan.interval_end, run_id=f"scheduled__{hour.isoformat()}",
                             ranges=list(plan.ranges), counts=counts, row_count=n,
                             committed_at=(hour + timedelta(hours=1, minutes=5)).isoformat(),
                             attempt=f"{plan.batch_id}.1", schema=SCHEMA, schema_source="declared")
        (batch / BATCH_RECORD).write_text(json.dumps(record.to_dict(), indent=1, sort_keys=True))


def hour_filter_value(dataset, name: str, when: datetime):
    """The partition value of `name` for `when`, in the type pyarrow's discovery inferred."""
    import pyarrow as pa

    t = dataset.schema.field(name).type
    raw = f"{when:%Y-%m-%d}" if name == "event_date" else when.hour
    if pa.types.is_date32(t):
        return pa.scalar(when.date(), t)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        return str(raw)
    return pa.scalar(raw, t)


def directory_year(args, work: Path, spark) -> list[dict]:
    import pyarrow.dataset as ds
    from pyspark.sql import functions as F

    rows = []
    target = open_kind("directory", work / "wh-year-directory", "year")
    t0 = time.perf_counter()
    build_directory_year(target, args.hours)
    print(f"  directory: {args.hours:,} hourly batches written in {time.perf_counter() - t0:.0f} s (not a "
          f"measurement); load average {loadavg()}", flush=True)
    dirs, files = walk_counts(target.table_dir)
    when = YEAR_START + timedelta(hours=args.hours // 2 + 10)  # one hour in the middle of the year
    for rep in range(READER_RUNS):
        t0 = time.perf_counter()
        dataset = ds.dataset(str(target.table_dir), format="parquet", partitioning="hive")
        t1 = time.perf_counter()
        condition = ((ds.field("event_date") == hour_filter_value(dataset, "event_date", when))
                     & (ds.field("event_hour") == hour_filter_value(dataset, "event_hour", when)))
        fragments = list(dataset.get_fragments(filter=condition))
        table = dataset.to_table(filter=condition)
        t2 = time.perf_counter()
        rows.append({"layout": "directory", "reader": "pyarrow.dataset (hive)", "run": rep + 1,
                     "batches": args.hours, "directories_listed": dirs, "files_listed": files,
                     "files_in_dataset": len(dataset.files), "data_files_read": len(fragments),
                     "rows": table.num_rows, "discover_s": t1 - t0, "filter_read_s": t2 - t1, "total_s": t2 - t0,
                     "loadavg": loadavg()})
        print(f"  directory pyarrow run {rep + 1}: discovery {t1 - t0:.2f} s, filter + read {t2 - t1:.3f} s, "
              f"{len(fragments)} file(s), {table.num_rows} rows", flush=True)
    if not args.no_spark_reader:
        for rep in range(args.repeat):
            # bounded: the jobs (Spark lists many directories with a job) are cancelled
            # after --spark-timeout seconds
            timer = threading.Timer(args.spark_timeout, spark.sparkContext.cancelAllJobs)
            timer.start()
            row = {"layout": "directory", "reader": "spark.read.parquet", "run": rep + 1, "batches": args.hours,
                   "directories_listed": dirs, "files_listed": files, "data_files_read": 1}
            t0 = time.perf_counter()
            try:
                df = spark.read.parquet(str(target.table_dir))
                t1 = time.perf_counter()
                hour_df = df.where((F.col("event_date") == F.lit(when.date())) & (F.col("event_hour") == when.hour))
                row["rows"] = hour_df.count()
                t2 = time.perf_counter()
                row.update(discover_s=t1 - t0, filter_read_s=t2 - t1, total_s=t2 - t0)
                print(f"  directory spark run {rep + 1}: listing + schema {t1 - t0:.2f} s, filter + count "
                      f"{t2 - t1:.2f} s, {row['rows']} rows", flush=True)
            except Exception as exc:  # noqa: BLE001 - cancelled by the timer
                row.update(total_s=time.perf_counter() - t0, error=f"cancelled after {args.spark_timeout} s: "
                           f"{type(exc).__name__}")
                print(f"  directory spark run {rep + 1}: {row['error']}", flush=True)
            finally:
                timer.cancel()
            row["loadavg"] = loadavg()
            rows.append(row)
    # the writer's side after a year: the next batch's commit (and the state read that
    # plan_batch does) read every batch record of the table
    for rep in range(args.repeat):
        t0 = time.perf_counter()
        state = target.state()
        t_state = time.perf_counter() - t0
        hour = YEAR_START + timedelta(hours=args.hours + rep)
        hour_ms = int(hour.timestamp() * 1000)
        first = (args.hours + rep) * ROWS_PER_HOUR_FILE
        plan = plan_of(target.table, hour, ranges_for(first, ROWS_PER_HOUR_FILE))
        staging = Path(target.prepare_staging(plan.batch_id, 1))
        write_staging(staging, "directory", 1, ROWS_PER_HOUR_FILE, first, hour_ms, 1)
        t0 = time.perf_counter()
        target.commit(plan, str(staging), "bench")
        t_commit = time.perf_counter() - t0
        rows.append({"layout": "directory", "reader": "writer: state() / commit of the next batch", "run": rep + 1,
                     "batches": len(state.batch_ids), "state_s": t_state, "commit_s": t_commit,
                     "loadavg": loadavg()})
        print(f"  directory writer run {rep + 1}: state() {t_state:.2f} s, commit {t_commit:.2f} s "
              f"({len(state.batch_ids):,} batches)", flush=True)
    shutil.rmtree(target.table_dir, ignore_errors=True)
    return rows


class ManifestCounter:
    """Counts the manifests pyiceberg opens while planning (`_open_manifest` calls)."""

    def __init__(self) -> None:
        import pyiceberg.table as module

        self.module = module
        self.real = module._open_manifest
        self.opened = 0

    def __enter__(self) -> "ManifestCounter":
        def counting(*args, **kwargs):
            self.opened += 1
            return self.real(*args, **kwargs)

        self.module._open_manifest = counting
        return self

    def __exit__(self, *exc) -> None:
        self.module._open_manifest = self.real


def iceberg_reader(target, snapshots: int, when: datetime, note: str, run: int) -> dict:
    from airflow_provider_logbus.targets.iceberg_tables import local_path

    end = when + timedelta(hours=1)
    row_filter = f"timestamp >= '{when.isoformat()}' and timestamp < '{end.isoformat()}'"
    t0 = time.perf_counter()
    table = target.catalog.load_table(target.identifier)
    t1 = time.perf_counter()
    snapshot = table.current_snapshot()
    manifests = snapshot.manifests(table.io)
    t2 = time.perf_counter()
    with ManifestCounter() as counter:
        tasks = list(table.scan(row_filter=row_filter).plan_files())
    t3 = time.perf_counter()
    data = table.scan(row_filter=row_filter).to_arrow()
    t4 = time.perf_counter()
    metadata_dir = Path(local_path(table.location())) / "metadata"
    return {"layout": "iceberg", "snapshots": snapshots, "note": note, "run": run,
            "snapshots_in_metadata": len(table.metadata.snapshots),
            "metadata_json_bytes": os.path.getsize(local_path(table.metadata_location)),
            "manifest_list_bytes": os.path.getsize(local_path(snapshot.manifest_list)),
            "manifests_listed": len(manifests), "manifests_opened": counter.opened, "data_files_planned": len(tasks),
            "rows": data.num_rows, "load_table_s": t1 - t0, "manifest_list_s": t2 - t1, "plan_files_s": t3 - t2,
            "scan_to_arrow_s": t4 - t3, "reader_total_s": (t1 - t0) + (t3 - t2) + (t4 - t3),
            "metadata_dir_bytes": sum(p.stat().st_size for p in metadata_dir.iterdir()),
            "metadata_dir_files": sum(1 for _ in metadata_dir.iterdir()), "loadavg": loadavg()}


def commit_hour(target, h: int) -> dict:
    hour = YEAR_START + timedelta(hours=h)
    hour_ms = int(hour.timestamp() * 1000)
    plan = plan_of(target.table, hour, ranges_for(h * ROWS_PER_HOUR_FILE, ROWS_PER_HOUR_FILE))
    staging = Path(target.prepare_staging(plan.batch_id, 1))
    write_staging(staging, target.layout, 1, ROWS_PER_HOUR_FILE, h * ROWS_PER_HOUR_FILE, hour_ms, 1)
    with Phases() as phases:
        t0 = time.perf_counter()
        result = target.commit(plan, str(staging), "bench")
        elapsed = time.perf_counter() - t0
    if not result.published_now:
        raise RuntimeError(f"hour {h} was not published")
    return {"commit_s": elapsed, **{f"{k}_s": v for k, v in phases.seconds.items()}}


def iceberg_year(args, work: Path) -> tuple[list[dict], list[dict]]:
    rows: list[dict] = []
    commits: list[dict] = []
    target = open_kind("iceberg", work / "wh-year-iceberg", "year")
    target.ensure_schema(value_schema())
    checkpoints = sorted(args.snapshots)
    started = time.perf_counter()
    for h in range(checkpoints[-1]):
        commits.append({"snapshot": h + 1, **commit_hour(target, h)})
        if h + 1 in checkpoints:
            recent = [c["commit_s"] for c in commits[-10:]]
            print(f"  iceberg: {h + 1} snapshots after {time.perf_counter() - started:.0f} s; last 10 commits median "
                  f"{statistics.median(recent):.3f} s; load average {loadavg()}", flush=True)
            when = YEAR_START + timedelta(hours=(h + 1) // 2)  # one hour in the middle of what is there
            for rep in range(READER_RUNS):
                row = iceberg_reader(target, h + 1, when, "as committed", rep + 1)
                row["commit_s_median_last10"] = statistics.median(recent)
                for phase in ("footers_s", "duplicate_check_s", "catalog_commit_s"):
                    row[f"{phase}_median_last10"] = statistics.median(c[phase] for c in commits[-10:])
                rows.append(row)
                print(f"    reader run {rep + 1}: load_table {row['load_table_s']:.3f} s, plan_files "
                      f"{row['plan_files_s']:.3f} s, {row['manifests_listed']} manifests listed, "
                      f"{row['manifests_opened']} opened, {row['data_files_planned']} file(s), metadata.json "
                      f"{row['metadata_json_bytes']:,} bytes, metadata/ {row['metadata_dir_bytes']:,} bytes",
                      flush=True)
    n = checkpoints[-1]
    when = YEAR_START + timedelta(hours=n // 2)
    # what Iceberg users do: expire old snapshots, and merge manifests
    batches_before = len(target.batches())
    table = target.table_or_fail()
    t0 = time.perf_counter()
    table.maintenance.expire_snapshots().older_than(datetime.now(timezone.utc)).commit()
    expire_s = time.perf_counter() - t0
    row = iceberg_reader(target, n, when, "after expire_snapshots (all but the current)", 1)
    row["maintenance_s"] = expire_s
    row["batches_visible_before"] = batches_before
    row["batches_visible_after"] = len(target.batches())
    row["old_batch_found_after"] = target.batch(plan_of("year", YEAR_START, []).batch_id) is not None
    rows.append(row)
    print(f"  expire_snapshots {expire_s:.2f} s: metadata.json {row['metadata_json_bytes']:,} bytes, "
          f"{row['manifests_listed']} manifests; batches the target sees: {batches_before} -> "
          f"{row['batches_visible_after']}", flush=True)
    with target.table_or_fail().transaction() as tx:
        tx.set_properties({"commit.manifest-merge.enabled": "true"})
    merge_s = commit_hour(target, n)["commit_s"]  # the next batch, committed by a merging append
    row = iceberg_reader(target, n + 1, when, "after one append with commit.manifest-merge.enabled", 1)
    row["maintenance_s"] = merge_s
    rows.append(row)
    print(f"  merging append {merge_s:.2f} s: {row['manifests_listed']} manifests listed, {row['manifests_opened']} "
          f"opened, plan_files {row['plan_files_s']:.3f} s", flush=True)
    rows[-1]["commit_s_next"] = commit_hour(target, n + 1)["commit_s"]
    target.close()
    return rows, commits


def fit(points: list[tuple[float, float]], x: float) -> float:
    """The least-squares line through `points`, evaluated at `x`."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((a - mx) * (b - my) for a, b in points) / sum((a - mx) ** 2 for a in xs)
    return my + slope * (x - mx)


def extrapolate(rows: list[dict], commits: list[dict], snapshots: list[int]) -> dict:
    """Each per-snapshot quantity against the number of snapshots, as a least-squares
    line through the checkpoints (fastest run of each), evaluated at 8,760; the metadata
    directory (one metadata.json kept per commit, each of linearly growing size) as the
    sum of the metadata.json line over 1 .. 8,760 commits."""
    measured = {n: [r for r in rows if r["snapshots"] == n and r["note"] == "as committed"] for n in snapshots}
    if len(snapshots) < 2 or not all(measured.values()):
        return {}

    def line(key: str) -> float:
        return fit([(n, min(r[key] for r in measured[n])) for n in snapshots], HOURS_PER_YEAR)

    json_points = [(n, measured[n][0]["metadata_json_bytes"]) for n in snapshots]
    metadata_dir = sum(fit(json_points, k) for k in range(1, HOURS_PER_YEAR + 1))
    commit_points = [(n, statistics.median(c["commit_s"] for c in commits if n - 10 < c["snapshot"] <= n))
                     for n in snapshots]
    return {"layout": "iceberg", "snapshots": HOURS_PER_YEAR,
            "note": "extrapolated: line through " + ", ".join(str(n) for n in snapshots),
            "snapshots_in_metadata": HOURS_PER_YEAR, "metadata_json_bytes": int(line("metadata_json_bytes")),
            "manifest_list_bytes": int(line("manifest_list_bytes")), "manifests_listed": HOURS_PER_YEAR,
            "manifests_opened": 1, "data_files_planned": 1, "load_table_s": line("load_table_s"),
            "manifest_list_s": line("manifest_list_s"), "plan_files_s": line("plan_files_s"),
            "reader_total_s": line("reader_total_s"), "metadata_dir_bytes": int(metadata_dir),
            "metadata_dir_files": 3 * HOURS_PER_YEAR,
            "commit_s_median_last10": fit(commit_points, HOURS_PER_YEAR)}


def part_year(args, work: Path, spark) -> dict[str, list[dict]]:
    directory = directory_year(args, work, spark)
    iceberg, commits = iceberg_year(args, work)
    guess = extrapolate(iceberg, commits, sorted(args.snapshots))
    if guess:
        iceberg.insert(len([r for r in iceberg if r["note"] == "as committed"]), guess)
    return {"year-directory": directory, "year-iceberg": iceberg, "year-iceberg-commits": commits}


# ------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--part", choices=["load", "commit", "year", "all"], default="all")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement (alternating target order)")
    parser.add_argument("--files", type=lambda s: [int(x) for x in s.split(",")], default=[10, 100, 1000])
    parser.add_argument("--snapshots", type=lambda s: [int(x) for x in s.split(",")], default=[168, 360, 720])
    parser.add_argument("--hours", type=int, default=HOURS_PER_YEAR, help="year: hourly batches of the directory table")
    parser.add_argument("--spark-timeout", type=float, default=600, help="year: cancel the Spark reader after this")
    parser.add_argument("--no-spark-reader", action="store_true", help="year: skip the Spark reader of one hour")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the CSV, JSON and Markdown go")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    started = datetime.now(timezone.utc)
    header = (f"{started:%Y-%m-%d %H:%M} UTC; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}; "
              f"load average at start {loadavg()}")
    print(header, flush=True)
    work = Path(tempfile.mkdtemp(prefix="logbus-bench-iceberg-"))
    out: dict[str, list[dict]] = {}
    report = [f"{header}\n"]
    uses_spark = args.part in ("load", "all") or (args.part == "year" and not args.no_spark_reader)
    # stopped in reverse order, also on failure: Spark (whose Python workers keep ZooKeeper
    # clients), the broker, ZooKeeper; the scratch directory last
    with contextlib.ExitStack() as stack:
        if not args.keep:
            stack.callback(shutil.rmtree, work, ignore_errors=True)
        if args.part in ("load", "all"):
            zookeeper = stack.enter_context(ZooKeeperServer(work / "zk"))
            local = stack.enter_context(LocalCluster(zookeeper.connect_string + "/bench", work,
                                                     {"log.flush.interval.ms": 100}))
        spark = stack.enter_context(local_session(conf={"spark.driver.memory": "4g"})) if uses_spark else None
        if args.part in ("load", "all"):
            print("part 1: load", flush=True)
            out["load"] = part_load(args, work, spark, local)
            report.append(markdown(f"Load of {args.messages:,} messages: whole batch path per target", out["load"], [
                "run", "target", "rows", "files", "plan_s", "load_s", "commit_s", "total_s", "rows_per_s",
                "load_s_ratio_to_directory", "commit_s_ratio_to_directory", "total_s_ratio_to_directory",
                "loadavg"]))
        if args.part in ("commit", "all"):
            print("part 2: commit against the number of files", flush=True)
            out["commit"] = part_commit(args, work)
            report.append(markdown("Commit against staged data files", out["commit"], [
                "files", "run", "target", "commit_s", "footers_s", "duplicate_check_s", "catalog_commit_s", "other_s",
                "metadata_json_bytes", "manifest_list_bytes",
                "manifest_bytes", "loadavg"]))
        if args.part in ("year", "all"):
            print("part 3: a year of hourly batches", flush=True)
            out.update(part_year(args, work, None if args.no_spark_reader else spark))
            report.append(markdown("A reader of one hour after a year: directory layout", [
                r for r in out["year-directory"] if "reader" in r and not r["reader"].startswith("writer")], [
                "reader", "run", "batches", "directories_listed", "files_listed", "data_files_read", "rows",
                "discover_s", "filter_read_s", "total_s", "loadavg"]))
            report.append(markdown("The directory target's writer after a year", [
                r for r in out["year-directory"] if r["reader"].startswith("writer")], [
                "reader", "run", "batches", "state_s", "commit_s", "loadavg"]))
            report.append(markdown("A reader of one hour: Iceberg, by number of hourly snapshots", out["year-iceberg"], [
                "snapshots", "note", "run", "metadata_json_bytes", "manifest_list_bytes", "manifests_listed",
                "manifests_opened", "data_files_planned", "load_table_s", "plan_files_s", "reader_total_s",
                "metadata_dir_bytes", "commit_s_median_last10", "maintenance_s"]))
    report.append(f"load average at end {loadavg()}; took {(datetime.now(timezone.utc) - started).seconds} s\n")
    print("\n" + "\n".join(report))
    for name, rows in out.items():
        write_results(args.results, name, rows)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"iceberg-{args.part}.json").write_text(json.dumps(
        {"started": started.isoformat(), "args": vars(args), "results": out}, indent=1, default=str))
    (args.results / f"iceberg-{args.part}.md").write_text("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
