"""The commit-target interface: where batches land, and the one commit protocol both
targets share (docs/provider.md, "The commit protocol").

A table is the source of truth for its own offsets: every committed batch records the
byte ranges it loaded, and the table's committed end per partition is where the next
batch must start. Runs of one table may overlap (a backfill has its own concurrency, a
manual trigger runs beside the schedule), so the commit is a compare-and-swap:

1. read the table's state (committed ends, committed batch ids, a version token);
2. if this batch id is already committed, stop: the retry is a no-op;
3. rebase the plan's ranges onto the committed ends: a batch that lost the race keeps
   only its rows at or past the new end (`plan.rebase`, `StagedBatch.trim`), so it
   never publishes an overlap and needs no second read of the broker;
4. publish data and record together *only if the version token is unchanged* — a
   directory rename under the table's lock, or a catalog commit that asserts the current
   snapshot — otherwise go back to 1.

A target implements the reading, the staging location and the conditional publish; the
loop lives here once.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
import copy
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from airflow_provider_logbus.plan import BatchPlan, Range, rebase
from airflow_provider_logbus.staged import COUNT_WINDOW_MS, StagedBatch, StagingError
from airflow_provider_logbus.storage import Storage

logger = logging.getLogger(__name__)


class TargetError(RuntimeError):
    """A table cannot be read or written; the message names the table and the fix."""


class CommitConflictError(TargetError):
    """The batch kept losing the commit race, or cannot follow the table's committed end."""


@dataclass
class BatchRecord:
    """The proof of what a batch loaded: ranges, counts per 10-minute window of the
    message timestamp (accepted and rejected), run id. `planned_ranges` holds the
    snapshot's ranges when the batch was re-planned at commit (it lost a race)."""

    table: str
    batch_id: str
    interval_start: str
    interval_end: str
    run_id: str
    ranges: list[Range]
    counts: list[dict]  # {"topic", "window_start", "count"}
    row_count: int
    committed_at: str = ""
    attempt: str = ""
    window_ms: int = COUNT_WINDOW_MS
    rejected: list[dict] = field(default_factory=list)
    rejected_count: int = 0
    schema: str | None = None
    schema_source: str | None = None
    planned_ranges: list[Range] | None = None
    extra: dict = field(default_factory=dict)
    # The data files the batch published (path inside the batch, rows): the directory
    # target's audit tells a batch's own files from ones copied in beside them. Empty
    # for Iceberg, whose manifests say which snapshot added each file, and for batches
    # committed before the list existed.
    files: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> "BatchRecord":
        """From the record's file form (`_logbus_batch.json`, a snapshot summary)."""
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["ranges"] = [Range.from_dict(r) for r in known.get("ranges", ())]
        if known.get("planned_ranges") is not None:
            known["planned_ranges"] = [Range.from_dict(r) for r in known["planned_ranges"]]
        return cls(**known)

    def to_dict(self) -> dict:
        """The record's file and XCom form; ranges as `Range.to_dict` writes them."""
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        d["ranges"] = [r.to_dict() for r in self.ranges]
        if self.planned_ranges is not None:
            d["planned_ranges"] = [r.to_dict() for r in self.planned_ranges]
        if not self.files:
            del d["files"]  # records without a file list keep their earlier form
        return copy.deepcopy(d)

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {r.partition: r.end for r in self.ranges if r.topic == topic}


@dataclass(frozen=True)
class TableFile:
    """The rows of one hour in one data file, as the table's metadata says (manifests,
    Parquet footers: no data read), and the logbus batch that published the file — None
    for a file that came into the table outside the commit protocol. `snapshot_id`: the
    Iceberg snapshot that added the file (None for the directory target), which is where
    to look for how a file outside every batch came in."""

    path: str
    hour_ms: int
    rows: int
    batch_id: str | None
    snapshot_id: int | None = None


@dataclass(frozen=True)
class TableContents:
    """What the audit's table tier compares, read together so that a commit in between
    cannot show files without their batch record: the batch records (what the batches
    claim) and the data files (what the table holds)."""

    batches: list[BatchRecord]
    files: list[TableFile]


@dataclass(frozen=True)
class TableState:
    """A consistent read of a table: `token` changes with every commit."""

    ends: dict[tuple[str, int], int]
    batch_ids: frozenset[str]
    token: Any
    exists: bool


@dataclass(frozen=True)
class CommitResult:
    record: BatchRecord
    published_now: bool

    @property
    def replanned(self) -> bool:
        return self.record.planned_ranges is not None


def committed_ends(records: list[BatchRecord]) -> dict[tuple[str, int], int]:
    """Per (topic, partition), the largest end any committed batch recorded."""
    ends: dict[tuple[str, int], int] = {}
    for record in records:
        for r in record.ranges:
            ends[r.key] = max(r.end, ends.get(r.key, r.end))
    return ends


class CommitTarget(ABC):
    """One table of one target kind. `layout` tells the Spark load job how to write;
    `storage` reaches the target's files (staging included) on disk or object store."""

    layout: str = "directory"
    max_commit_rounds: int = 50

    def __init__(self, table: str, storage: Storage | None = None) -> None:
        self.table = table
        self.storage = storage or Storage()

    def storage_properties(self) -> dict[str, str]:
        """The object-store settings the load job needs to reach staging (`storage.py`)."""
        return dict(self.storage.properties)

    # ----------------------------------------------------------------- reading

    @abstractmethod
    def state(self) -> TableState:
        """Committed ends, batch ids and the version token, read together."""

    @abstractmethod
    def batch(self, batch_id: str) -> BatchRecord | None:
        """The record of a committed batch, or None."""

    @abstractmethod
    def batches(self) -> list[BatchRecord]:
        """Every committed batch, oldest interval first (the audit's input)."""

    @abstractmethod
    def dataset(self) -> tuple[str, str]:
        """(namespace, name) of this table in lineage events, after OpenLineage's naming."""

    def exists(self) -> bool:
        return self.state().exists

    def committed_end_offsets(self, topic: str) -> dict[int, int]:
        return {p: end for (t, p), end in self.state().ends.items() if t == topic}

    # ----------------------------------------------------------------- writing

    def ensure_schema(self, value_schema: Any | None) -> None:
        """Before a load: create the table from the declared value schema (a
        `pyarrow.Schema`), or evolve it when the declaration gained optional fields; an
        incompatible change raises `schema.SchemaError` naming the field. A target whose
        files carry their own schema (the directory target) has nothing to do."""

    def check_schema(self, value_schema: Any) -> list[str]:
        """Whether the table could take `value_schema` (a `pyarrow.Schema`) by the rules of
        `ensure_schema`, changing nothing: the columns it would add, or `SchemaError`
        naming the field. A target whose files carry their own schema compares with the
        declaration of its latest batch that recorded one (none: anything goes)."""
        from airflow_provider_logbus.schema import check_evolution, load_schema

        declared = [r.schema for r in sorted(self.batches(), key=lambda r: r.committed_at)
                    if r.schema and r.schema_source == "declared"]
        return check_evolution(load_schema(declared[-1]).to_arrow(), value_schema) if declared else []

    def finish(self, record: BatchRecord) -> None:
        """After the commit point (also on a retry that finds the batch committed):
        complete what follows it, idempotently — e.g. publish the batch's rejects."""

    @abstractmethod
    def prepare_staging(self, batch_id: str, attempt: int | str) -> str:
        """A fresh, empty location for one load attempt's files."""

    @abstractmethod
    def remove_attempts(self, batch_id: str, keep: str | None = None) -> None:
        """Delete staging left by other (failed or superseded) attempts of a batch."""

    @abstractmethod
    def publish(self, state: TableState, record: BatchRecord, staged: StagedBatch) -> bool:
        """Make data and record visible at once, only if the table is still at
        `state.token`. False when another commit came first (nothing changed)."""

    def commit(self, plan: BatchPlan, staging: str | None, run_id: str) -> CommitResult:
        """The compare-and-swap commit (module docstring). Idempotent per batch id."""
        ranges = list(plan.ranges)
        staged: StagedBatch | None = None
        for _ in range(self.max_commit_rounds):
            state = self.state()
            if plan.batch_id in state.batch_ids:
                record = self.batch(plan.batch_id)
                if record is not None:
                    logger.info("batch %s of %s is already committed; nothing to do", plan.batch_id, self.table)
                    self.finish(record)
                    self.remove_attempts(plan.batch_id)
                    return CommitResult(record, False)
            try:
                if staged is None:
                    if not staging:
                        raise TargetError(
                            f"batch {plan.batch_id} of {self.table} has no staging: run the load task again")
                    staged = StagedBatch.read(staging, self.storage)
                ranges, published = self._try_publish(plan, ranges, staged, state, run_id)
            except (OSError, StagingError):
                # another attempt of this batch committed and removed our staging meanwhile?
                record = self.batch(plan.batch_id)
                if record is None:
                    raise
                logger.info("batch %s of %s was committed by another attempt meanwhile", plan.batch_id, self.table)
                return CommitResult(record, False)
            if published is not None:
                self.finish(published)
                self.remove_attempts(plan.batch_id, keep=str(staged.root))
                logger.info("committed batch %s of %s: %d rows, %d rejected%s", plan.batch_id, self.table,
                            published.row_count, published.rejected_count,
                            " (re-planned after a concurrent commit)" if published.planned_ranges else "")
                return CommitResult(published, True)
            logger.info("batch %s of %s: another batch committed meanwhile; reading the table again",
                        plan.batch_id, self.table)
        raise CommitConflictError(
            f"batch {plan.batch_id} of {self.table} lost the commit race {self.max_commit_rounds} times in a row")

    def _try_publish(self, plan: BatchPlan, ranges: list[Range], staged: StagedBatch, state: TableState,
                     run_id: str) -> tuple[list[Range], BatchRecord | None]:
        """One round: rebase onto `state`, trim, publish if `state` still holds. Returns
        the ranges the staged data now holds, and the record when it was published."""
        try:
            rebased = rebase(ranges, state.ends)
        except ValueError as exc:
            raise CommitConflictError(
                f"batch {plan.batch_id} cannot follow table {self.table!r}: {exc}; clear the run's snapshot "
                "task so that it plans again from the table's committed ends") from None
        if rebased != ranges:
            logger.warning(
                "batch %s of %s: another run committed these offsets first (%s); re-planning onto %s and "
                "keeping only the rows past the table's committed end", plan.batch_id, self.table,
                describe(ranges), describe(rebased))
            staged.trim(rebased)
        record = self._record(plan, rebased, staged, run_id)
        return rebased, (record if self.publish(state, record, staged) else None)

    def _record(self, plan: BatchPlan, ranges: list[Range], staged: StagedBatch, run_id: str) -> BatchRecord:
        planned, final = list(plan.ranges), list(ranges)
        return BatchRecord(
            table=self.table, batch_id=plan.batch_id, interval_start=plan.interval_start,
            interval_end=plan.interval_end, run_id=run_id, ranges=final, counts=staged.counts,
            row_count=staged.row_count, committed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            attempt=staged.name, window_ms=staged.window_ms, rejected=staged.rejected,
            rejected_count=staged.rejected_count, schema=staged.schema, schema_source=staged.schema_source,
            planned_ranges=None if final == planned else planned, extra={"staging": str(staged.root)})

    # ----------------------------------------------------------------- audit

    @abstractmethod
    def contents(self, since_ms: int | None = None) -> TableContents:
        """The committed batches and the rows the table holds per data file and hour,
        from metadata only. Files of hours before `since_ms` may be left out (the audit
        does not look at them), so that a long-lived table's old files are not opened."""

    @abstractmethod
    def write_audit(self, audit_id: str, report: dict) -> str:
        """Keep an audit report beside the table; returns where."""

    @abstractmethod
    def announcement(self) -> dict | None:
        """The last announcement of complete hours: {"complete_through_ms": every hour
        before it was found complete and announced, "run_id", "hours"}; None before any."""

    @abstractmethod
    def announce(self, expected: dict | None, new: dict) -> bool:
        """Replace the announcement `expected` by `new` — a compare-and-swap, so that of
        two audits finding the same hours complete only one announces them."""

    @abstractmethod
    def reject_files(self, batch_id: str) -> list[str]:
        """The Parquet files holding the values committed batch `batch_id` rejected
        (topic, partition, offset, timestamp, key, headers, value, error); [] when it rejected
        none."""

    def snapshot(self, snapshot_id: int) -> dict | None:
        """A table version's id, parent, time, operation and summary, for people tracing
        how a file came in (the Airflow page); None where the target has no versions."""
        return None

    def complete_through(self) -> int | None:
        """The `logbus.complete-through` watermark in ms, or None."""
        current = self.announcement()
        return int(current["complete_through_ms"]) if current else None

    def close(self) -> None:
        """Release catalog connections."""


def describe(ranges: list[Range]) -> str:
    return ", ".join(f"{r.topic}-{r.partition} [{r.start}, {r.end})" for r in ranges)
