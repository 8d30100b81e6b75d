"""Staged batches written with pyarrow exactly as the load job lays them out, and child
processes that commit one or create a table as a load does — so the commit protocol and
table creation can be raced and killed for real without starting Spark for every attempt."""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from pathlib import Path

ENTRY = 100  # bytes per message: offsets start, start+100, ...
T0 = 1_704_067_200_000  # 2024-01-01T00:00Z


def wait_all(procs: list, timeout: float) -> list[int]:
    """Each child's exit code; children still running when waiting fails are killed."""
    try:
        return [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def offsets(start: int, end: int) -> range:
    return range(start, end, ENTRY)


def write_staging(staging: str | os.PathLike, ranges: list[dict], layout: str = "directory", *, t0: int = T0,
                  files: int = 1, storage=None) -> int:
    """Rows for every message of `ranges` (timestamp = t0 + offset ms; t0 an hour's start)
    in `files` Parquet files, counts file beside; on a disk, or through `storage` (an
    object store)."""
    import pyarrow as pa

    from airflow_provider_logbus.staged import COUNTS_FILE, count_windows
    from airflow_provider_logbus.storage import Storage, join

    storage = storage or Storage()
    rows = [(r["topic"], int(r["partition"]), o) for r in ranges for o in offsets(int(r["start"]), int(r["end"]))]
    directory = join(staging, "event_date=2024-01-01/event_hour=0" if layout == "directory"
                     else f"logbus_hour={t0 // 3_600_000}")
    storage.make_dirs(directory)
    if rows:
        table = pa.table({
            "topic": pa.array([r[0] for r in rows], pa.string()),
            "partition": pa.array([r[1] for r in rows], pa.int32()),
            "offset": pa.array([r[2] for r in rows], pa.int64()),
            "timestamp": pa.array([t0 + r[2] for r in rows], pa.timestamp("ms", tz="UTC")).cast(
                pa.timestamp("us", tz="UTC")),
            "key": pa.array([None] * len(rows), pa.binary()),
            # directory layout: the raw value; iceberg layout: a declared value field `n`
            **({"value": pa.array([b"{}"] * len(rows), pa.binary())} if layout == "directory"
               else {"n": pa.array([r[2] for r in rows], pa.int64())}),
        })
        size = -(-table.num_rows // files)
        for start in range(0, table.num_rows, size):
            storage.write_parquet(join(directory, f"part-{uuid.uuid4().hex}.parquet"), table.slice(start, size))
    counts, n = count_windows(storage.files(staging, ".parquet"), storage=storage)
    storage.write_json(join(staging, COUNTS_FILE), {"counts": counts, "row_count": n, "window_ms": 600_000,
                                                    "rejected": [], "rejected_count": 0})
    return n


def plan(batch_id: str, ranges: list[dict], table: str = "tbl") -> dict:
    return {"batch_id": batch_id, "table": table, "topic": ranges[0]["topic"], "interval_start": batch_id,
            "interval_end": batch_id, "ranges": ranges, "committed": False}


def child_command(warehouse: str, plan_dict: dict, staging: str, result: str, *, barrier: str | None = None,
                  kill_at: str | None = None, kind: str = "directory", catalog: dict | None = None) -> list[str]:
    return [sys.executable, "-m", "tests.provider.stagingutil", json.dumps({
        "action": "commit", "warehouse": warehouse, "plan": plan_dict, "staging": staging, "result": result,
        "barrier": barrier, "kill_at": kill_at, "kind": kind, "catalog": catalog})]


def create_table_command(warehouse: str, table: str, value_ddl: str, *, barrier: str,
                         catalog: dict | None = None) -> list[str]:
    """A child that opens the Iceberg target and creates (or checks) `table` from the
    declared `value_ddl`, as a load does before Spark starts; once `barrier` exists."""
    return [sys.executable, "-m", "tests.provider.stagingutil", json.dumps({
        "action": "create-table", "warehouse": warehouse, "table": table, "value_ddl": value_ddl,
        "barrier": barrier, "catalog": catalog})]


def _wait_for(barrier: str | None) -> None:
    """Several children released at the same moment: each polls for the file."""
    import time

    while barrier and not os.path.exists(barrier):
        time.sleep(0.001)


def _kill_around(owner, name: str, when: str) -> None:
    """Replace `owner.name` so that the process SIGKILLs itself before or after it."""
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(*args, **kwargs)
        if when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(owner, name, wrapper)


def _child(args: dict) -> None:
    """Commit one staged batch; wait for `barrier` to exist first (so that several
    children commit at the same moment); SIGKILL itself at `kill_at`: "before-rename" /
    "after-rename" (directory: record written / published, not yet reported),
    "before-catalog-commit" / "after-catalog-commit" (Iceberg), "before-rejects"."""
    from airflow_provider_logbus.plan import BatchPlan
    from airflow_provider_logbus.targets import open_target

    kill_at = args["kill_at"] or ""
    if kill_at.endswith("-rename"):
        _kill_around(os, "rename", kill_at.split("-")[0])
    elif kill_at.endswith("-catalog-commit"):
        from pyiceberg.table import Table

        _kill_around(Table, "_do_commit", kill_at.split("-")[0])
    elif kill_at == "before-rejects":
        from airflow_provider_logbus.targets.iceberg import IcebergTarget

        _kill_around(IcebergTarget, "finish", "before")
    _wait_for(args["barrier"])
    plan_obj = BatchPlan.from_dict(args["plan"])
    target = open_target(args["kind"], plan_obj.table, warehouse=args["warehouse"], catalog=args["catalog"])
    result = target.commit(plan_obj, args["staging"], "run")
    Path(args["result"]).write_text(json.dumps({**result.record.to_dict(), "published_now": result.published_now}))


def _create_table(args: dict) -> None:
    from airflow_provider_logbus.schema import load_schema
    from airflow_provider_logbus.targets import open_target

    schema = load_schema(args["value_ddl"]).to_arrow()
    _wait_for(args["barrier"])
    target = open_target("iceberg", args["table"], warehouse=args["warehouse"], catalog=args["catalog"])
    try:
        target.ensure_schema(schema)
    finally:
        target.close()


if __name__ == "__main__":
    arguments = json.loads(sys.argv[1])
    {"commit": _child, "create-table": _create_table}[arguments["action"]](arguments)
