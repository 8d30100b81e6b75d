"""What one load attempt staged, read and reshaped with pyarrow (no Spark, no Airflow).

The Spark load job writes a batch's Parquet files and `_logbus_counts.json` into a
staging directory (rejected values under `_rejects/`). The commit needs two things from
it without starting Spark again:

* `trim`: when another run committed first, keep only the rows at or past the table's
  new committed end — the batch re-plans onto the rows it already holds;
* `count_windows`: rows per (topic, 10-minute window of the message timestamp) of what
  remains, so the batch's record stays exact after a trim.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from airflow_provider_logbus.plan import Range
from airflow_provider_logbus.storage import Storage, join, name_of, parent_of

logger = logging.getLogger(__name__)

COUNTS_FILE = "_logbus_counts.json"
REJECTS_DIR = "_rejects"
COUNT_WINDOW_MS = 600_000


def write_json_atomic(path: Path, obj, tmp_dir: Path | None = None) -> None:
    """Write a JSON file on a local disk so that readers see the old file or the new one,
    never half (`Storage.write_json`)."""
    Storage().write_json(str(path), obj, str(tmp_dir) if tmp_dir is not None else None)


def reject_files(root: str | os.PathLike, storage: Storage | None = None) -> list[str]:
    """The Parquet files of the values a load attempt rejected (`<root>/_rejects/`)."""
    return (storage or Storage()).files(join(str(root), REJECTS_DIR), ".parquet")


def load_result(ranges: Sequence[Range], *, value_format: str, layout: str, schema: str | None = None,
                schema_source: str | None = None, window_ms: int = COUNT_WINDOW_MS,
                written: dict | None = None) -> dict:
    """The counts file's content (its format: `spark/load_job.py`): what the writer
    counted (`written`: counts, row_count, rejected, rejected_count; nothing for a batch
    whose ranges are empty) and how the attempt was loaded."""
    written = written or {"counts": [], "row_count": 0, "rejected": [], "rejected_count": 0}
    return {"counts": written["counts"], "row_count": written["row_count"], "window_ms": window_ms,
            "ranges": [r.to_dict() for r in ranges], "format": value_format, "layout": layout,
            "rejected": written["rejected"], "rejected_count": written["rejected_count"], "schema": schema,
            "schema_source": schema_source}


def write_result(root: str, result: dict, storage: Storage) -> None:
    """Write the counts file, which makes the attempt in `root` committable."""
    storage.make_dirs(root)
    storage.write_json(join(root, COUNTS_FILE), result, tmp_dir=parent_of(root))


class StagingError(RuntimeError):
    """A staging directory is missing or incomplete; the message says which and why."""


@dataclass
class StagedBatch:
    """The load job's output for one attempt, as the commit sees it: `root` is a local
    path or an object-store URI, read through `storage`."""

    root: str
    counts: list[dict]
    row_count: int
    rejected: list[dict] = field(default_factory=list)
    rejected_count: int = 0
    window_ms: int = COUNT_WINDOW_MS
    schema: str | None = None
    schema_source: str | None = None
    storage: Storage = field(default_factory=Storage, repr=False, compare=False)

    @classmethod
    def read(cls, root: str | os.PathLike, storage: Storage | None = None) -> "StagedBatch":
        root, storage = str(root), storage or Storage()
        if not storage.is_dir(root):
            raise StagingError(f"staging directory {root} does not exist; run the load task again")
        try:
            info = storage.read_json(join(root, COUNTS_FILE))
        except FileNotFoundError:
            raise StagingError(
                f"staging {root} has no {COUNTS_FILE}: the load job did not finish for this attempt; "
                "run the load task again") from None
        return cls(root=root, counts=list(info.get("counts", [])), row_count=int(info.get("row_count", 0)),
                   rejected=list(info.get("rejected", [])), rejected_count=int(info.get("rejected_count", 0)),
                   window_ms=int(info.get("window_ms", COUNT_WINDOW_MS)), schema=info.get("schema"),
                   schema_source=info.get("schema_source"), storage=storage)

    @property
    def name(self) -> str:
        """The attempt's name, `<batch_id>.<attempt>`."""
        return name_of(self.root)

    def data_files(self) -> list[str]:
        rejects = join(self.root, REJECTS_DIR) + "/"
        return [p for p in self.storage.files(self.root, ".parquet") if not p.startswith(rejects)]

    def reject_files(self) -> list[str]:
        return reject_files(self.root, self.storage)

    def file_rows(self) -> dict[str, int]:
        """Rows per data file (path inside the staging directory), from the footers."""
        prefix = self.root.rstrip("/") + "/"
        return {p[len(prefix):]: self.storage.parquet_rows(p) for p in self.data_files()}

    def write_counts(self) -> None:
        info = self.storage.read_json(join(self.root, COUNTS_FILE))
        info.update(counts=self.counts, row_count=self.row_count, rejected=self.rejected,
                    rejected_count=self.rejected_count)
        write_result(self.root, info, self.storage)

    def trim(self, ranges: list[Range]) -> "StagedBatch":
        """Drop the rows outside `ranges` (only ever rows below a range's new start, after
        `plan.rebase`) from data and rejects, rewriting only the files that mix both, and
        recount. The counts file is rewritten too, so a later retry of the commit sees the
        trimmed attempt as it is on disk."""
        keep_from = {r.key: r.start for r in ranges}
        for path in self.data_files() + self.reject_files():
            _trim_file(self.storage, path, keep_from)
        self.counts, self.row_count = count_windows(self.data_files(), self.window_ms, self.storage)
        self.rejected, self.rejected_count = count_windows(self.reject_files(), self.window_ms, self.storage)
        self.write_counts()
        logger.info("trimmed staging %s to %d rows and %d rejects", self.root, self.row_count, self.rejected_count)
        return self


def _trim_file(storage: Storage, path: str, keep_from: dict[tuple[str, int], int]) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    table = storage.read_parquet(path)  # one file alone: Hive partition columns stay in the path
    if table.num_rows == 0:
        return
    keep = pa.array([True] * table.num_rows)
    for (topic, partition), start in keep_from.items():
        here = pc.and_(pc.equal(table["topic"], topic), pc.equal(table["partition"], partition))
        keep = pc.and_(keep, pc.or_(pc.invert(here), pc.greater_equal(table["offset"], start)))
    kept = int(pc.sum(keep.cast("int64")).as_py() or 0)
    if kept == table.num_rows:
        return
    if kept == 0:
        storage.delete_file(path)
        return
    storage.write_parquet(path, table.filter(keep))


def count_windows(files: list, window_ms: int = COUNT_WINDOW_MS,
                  storage: Storage | None = None) -> tuple[list[dict], int]:
    """Rows per (topic, window of the message timestamp) in Parquet `files`, sorted."""
    storage = storage or Storage()
    counts: dict[tuple[str, int], int] = {}
    for path in files:
        add_window_counts(storage.read_parquet(str(path), columns=["topic", "timestamp"]), window_ms, counts)
    return window_rows(counts), sum(counts.values())


def window_rows(counts: dict[tuple[str, int], int]) -> list[dict]:
    """Counts per (topic, window start) as the counts files list them, sorted."""
    return [{"topic": t, "window_start": w, "count": n} for (t, w), n in sorted(counts.items())]


def add_window_counts(table, window_ms: int, counts: dict[tuple[str, int], int]) -> None:
    """Add the rows of `table` (topic, timestamp columns) per (topic, window start ms)
    to `counts`: what staging files and the load job's writer both count."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return
    ts = table["timestamp"]
    ms = pc.cast(ts, pa.timestamp("ms", tz=ts.type.tz), safe=False).cast(pa.int64())
    windows = pc.multiply(pc.divide(ms, window_ms), window_ms)
    grouped = pa.table({"topic": table["topic"], "window": windows}).group_by(["topic", "window"]).aggregate(
        [("window", "count")])
    for topic, window, n in zip(*(grouped[c].to_pylist() for c in ("topic", "window", "window_count"))):
        counts[(topic, window)] = counts.get((topic, window), 0) + n
