"""Benchmark (issue 21): hourly batches into an Iceberg table with and without the daily
maintenance (`targets/iceberg_maintenance.maintain`: compaction of closed hours, ledger
sync, snapshot expiry past a week of batches, orphan removal), side by side.

    .venv/bin/python -m bench.maintenance --files 4 --checkpoints 168,720 [--tables maintained]

Each batch is one hour's `--files` small files (`--rows` rows each, written with pyarrow
in the iceberg staging layout) committed through `IcebergTarget.commit` — the real
commit, with its ledger append — into two tables: one maintained every 24 batches, one
never. At each checkpoint, per table: data files per closed hour, the metadata
directory's bytes and files, the median of the last 10 commits, the number of
snapshots, the current snapshot's manifests (how many, the largest's bytes), and a
reader of one hour in the middle and one of the last closed hour (load the table, plan,
read to Arrow; fastest of three). Nothing here asserts a time; results go to stdout and
`bench/results/maintenance.{json,md}` (git-ignored). Scratch files are removed on the
way out, also on failure (exit status 1) or SIGTERM — except a `--workdir`, which keeps
the tables and `progress.json` so that the next run with the same options carries on
from the last day saved (a year of batches takes longer than one sitting).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.iceberg import (  # noqa: E402
    HOUR_MS, RESULTS, YEAR_START, loadavg, markdown, plan_of, value_schema, write_staging,
)

DAY = 24
KEEP_SNAPSHOTS = 7 * DAY  # expiry keeps a week of batches


def commit_hour(target, h: int, files: int, rows: int) -> float:
    hour = YEAR_START + timedelta(hours=h)
    staging = Path(target.prepare_staging(f"h{h:05d}", 1))
    ranges = write_staging(staging, "iceberg", files, rows, h * files * rows, int(hour.timestamp() * 1000), 1)
    plan = plan_of(target.table, hour, ranges)
    t0 = time.perf_counter()
    if not target.commit(plan, str(staging), "bench").published_now:
        raise RuntimeError(f"hour {h} was not published")
    return time.perf_counter() - t0


def maintain_daily(target, h: int) -> float:
    """The daily run, in simulated time: hours before the last one are closed; snapshots
    older than a week of batches are expired; orphans are removed at once (nothing is
    being written meanwhile)."""
    from airflow_provider_logbus.targets.iceberg_maintenance import maintain

    table = target.table_or_fail()
    snapshots = sorted(s.timestamp_ms for s in table.metadata.snapshots)
    keep_from = snapshots[-KEEP_SNAPSHOTS] if len(snapshots) > KEEP_SNAPSHOTS else None
    closed = int((YEAR_START + timedelta(hours=h)).timestamp() * 1000)
    t0 = time.perf_counter()
    maintain(target, closed_before_ms=closed, compact_since_ms=closed - 2 * DAY * HOUR_MS,
             expire_older_than_ms=keep_from, orphans_older_than_s=0)
    return time.perf_counter() - t0


def read_hour(target, h: int) -> tuple[float, int]:
    """A reader of hour `h`: load the table, plan, read to Arrow; the fastest of three
    (seconds, rows)."""
    when = YEAR_START + timedelta(hours=h)
    row_filter = f"timestamp >= '{when.isoformat()}' and timestamp < '{(when + timedelta(hours=1)).isoformat()}'"
    readers = []
    for _ in range(3):
        t0 = time.perf_counter()
        rows = target.catalog.load_table(target.identifier).scan(row_filter=row_filter).to_arrow().num_rows
        readers.append(time.perf_counter() - t0)
    return min(readers), rows


def measure(target, hours: int, recent_commits: list[float]) -> dict:
    from airflow_provider_logbus.targets.iceberg_tables import local_path

    table = target.table_or_fail()
    per_hour: dict[int, int] = {}
    for task in table.scan().plan_files():
        per_hour[task.file.partition[0]] = per_hour.get(task.file.partition[0], 0) + 1
    closed = [n for hour, n in per_hour.items() if hour < min(per_hour) + hours - 1]
    middle, rows = read_hour(target, hours // 2)
    last, _ = read_hour(target, hours - 2)
    metadata = Path(local_path(table.location())) / "metadata"
    manifests = table.current_snapshot().manifests(table.io)
    return {"files_per_closed_hour": statistics.fmean(closed) if closed else 0.0,
            "snapshots": len(table.metadata.snapshots), "metadata_bytes": sum(p.stat().st_size
                                                                            for p in metadata.iterdir()),
            "metadata_files": sum(1 for _ in metadata.iterdir()), "manifests": len(manifests),
            "largest_manifest_bytes": max(m.manifest_length for m in manifests),
            "commit_s_median_last10": statistics.median(recent_commits[-10:]), "reader_s": middle,
            "reader_last_s": last,
            "reader_rows": rows, "batches_visible": len(target.batches())}


class Progress:
    """What a run has done so far, in `<work>/progress.json`: a year takes longer than one
    sitting, and `--workdir` lets the next run carry on where the last stopped."""

    def __init__(self, path: Path, args) -> None:
        self.path = path
        self.setup = {"files": args.files, "rows": args.rows, "tables": args.tables, "transaction": args.transaction}
        if args.manifest_target_bytes is not None:
            self.setup["manifest_target_bytes"] = args.manifest_target_bytes
        state = json.loads(path.read_text()) if path.exists() else {}
        if state and state["setup"] != self.setup:
            raise SystemExit(f"{path} is from a run with {state['setup']}, not {self.setup}: use another --workdir")
        self.commits: dict[str, list[float]] = state.get("commits", {kind: [] for kind in args.tables})
        self.maintenance: list[float] = state.get("maintenance", [])
        self.maintained_days: int = state.get("maintained_days", 0)
        self.rows: list[dict] = state.get("rows", [])
        self.elapsed_s: float = state.get("elapsed_s", 0.0)

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"setup": self.setup, "commits": self.commits, "maintenance": self.maintenance,
                                   "maintained_days": self.maintained_days, "rows": self.rows,
                                   "elapsed_s": self.elapsed_s}))
        tmp.replace(self.path)


def committed_hours(target) -> int:
    """Batches h00000.. the table holds (a resumed run's tables may differ by one: the
    run can stop between them)."""
    return len({r.batch_id for r in target.batches()})


def run(args, work: Path) -> list[dict]:
    from airflow_provider_logbus.targets.iceberg import IcebergTarget

    progress = Progress(work / "progress.json", args)
    targets = {kind: IcebergTarget("t", warehouse=str(work / kind)) for kind in args.tables}
    try:
        for target in targets.values():
            target.ensure_schema(value_schema())
        done = {kind: committed_hours(target) for kind, target in targets.items()}
        for kind, n in done.items():
            del progress.commits[kind][n:]  # commits timed after the last save, or never made
        start = min(done.values())
        if start:
            print(f"  resuming at batch {start + 1} ({progress.elapsed_s:.0f} s so far)", flush=True)
        if "maintained" in targets and start // DAY > progress.maintained_days:  # stopped before its daily run
            progress.maintenance.append(maintain_daily(targets["maintained"], start // DAY * DAY))
            progress.maintained_days = start // DAY
        began = time.perf_counter() - progress.elapsed_s
        for h in range(start, max(args.checkpoints)):
            for kind, target in targets.items():  # alternating: the machine's noise hits both
                if h >= done[kind]:
                    progress.commits[kind].append(commit_hour(target, h, args.files, args.rows))
            if (h + 1) % DAY == 0 and "maintained" in targets:
                progress.maintenance.append(maintain_daily(targets["maintained"], h + 1))
                progress.maintained_days = (h + 1) // DAY
            if h + 1 in args.checkpoints:
                for kind, target in targets.items():
                    commits = progress.commits[kind]
                    row = {"batches": h + 1, "table": kind, **measure(target, h + 1, commits),
                           "first_commits_s": statistics.median(commits[:10]),
                           "maintenance_s_median": (statistics.median(progress.maintenance)
                                                    if kind == "maintained" and progress.maintenance else None),
                           "loadavg": loadavg()}
                    progress.rows.append(row)
                    print(json.dumps(row), flush=True)
                print(f"  {h + 1} batches after {time.perf_counter() - began:.0f} s", flush=True)
            if (h + 1) % DAY == 0 or h + 1 in args.checkpoints:
                progress.elapsed_s = time.perf_counter() - began
                progress.save()
    finally:
        for target in targets.values():
            target.close()
    return progress.rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=lambda s: sorted(int(x) for x in s.split(",")), default=[168, 720])
    parser.add_argument("--files", type=int, default=4, help="small files per batch")
    parser.add_argument("--rows", type=int, default=200, help="rows per small file")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--keep-on-failure", action="store_true",
                        help="leave the tables (and their catalog) behind when the run fails, for a post-mortem")
    parser.add_argument("--workdir", type=Path,
                        help="keep the tables and the run's progress here, and carry on from them when they are "
                             "there: a year takes hours (remove the directory when done)")
    parser.add_argument("--transaction", choices=["once", "pyiceberg"], default="once",
                        help="the commits' transaction: logbus's MetadataOnceTransaction (default) or pyiceberg's own")
    parser.add_argument("--manifest-target-bytes", type=int,
                        help="the tables' commit.manifest.target-size-bytes instead of logbus's default "
                             "(targets/iceberg_tables.TABLE_PROPERTIES), to compare")
    parser.add_argument("--tables", type=lambda s: s.split(","), default=["maintained", "never"],
                        help="maintained,never (default) or one of them: a year of the never-maintained table "
                             "takes hours more")
    args = parser.parse_args(argv)
    if args.transaction == "pyiceberg":
        from pyiceberg.table import Transaction

        from airflow_provider_logbus.targets import iceberg_transaction

        iceberg_transaction.transaction = Transaction  # every commit of the targets opens it
    if args.manifest_target_bytes is not None:
        from airflow_provider_logbus.targets.iceberg_tables import TABLE_PROPERTIES

        TABLE_PROPERTIES["commit.manifest.target-size-bytes"] = str(args.manifest_target_bytes)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run cleans up too
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-maintenance-"))
    keep = args.workdir is not None
    try:
        rows = run(args, work)
    except Exception as exc:
        keep = keep or args.keep_on_failure
        print(f"benchmark failed: {exc!r}" + (f" (tables kept in {work})" if keep else ""), file=sys.stderr)
        return 1
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    columns = ["batches", "table", "files_per_closed_hour", "snapshots", "metadata_bytes", "metadata_files",
               "manifests", "largest_manifest_bytes", "first_commits_s", "commit_s_median_last10", "reader_s", "reader_last_s", "reader_rows", "batches_visible",
               "maintenance_s_median"]
    report = markdown(f"Hourly batches of {args.files} files x {args.rows} rows, maintained daily or never "
                      f"(`python -m bench.maintenance --checkpoints {','.join(map(str, args.checkpoints))} "
                      f"--files {args.files} --rows {args.rows} --tables {','.join(args.tables)} "
                      f"--transaction {args.transaction}"
                      + (f" --manifest-target-bytes {args.manifest_target_bytes}" if args.manifest_target_bytes else "")
                      + "`)", rows, columns)
    print(report)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "maintenance.json").write_text(json.dumps(rows, indent=1))
    (args.results / "maintenance.md").write_text(report)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
