"""Compaction of a logbus Iceberg table: a closed hour's small files (one per Spark task
per batch) rewritten into ceil(bytes / target) files, in one snapshot per hour that
replaces them — the rows, the committed offsets and the batch records unchanged.

The audit counts what the table holds per batch and hour from its metadata, and a file a
compaction writes holds several batches' rows. So the compaction accounts for every row:
it labels each with the batch whose ranges hold its (topic, partition, offset), checks
that the labels give exactly the rows the files' own batches hold, and writes the count
per batch of every new file into its snapshot's summary (`logbus.compaction`) and into
the ledger. An hour whose rows cannot be accounted so — a file that came in outside the
commit protocol, rows no range or two ranges hold, position deletes — is left as it is
and reported: compacting it would hide from the audit what the audit must see.

The replace commit asserts that the table is still at the snapshot read, like a load's;
when a load commits in between, the hour is read again (up to `ATTEMPTS` times) and
otherwise left for the next run. The files of a lost attempt are deleted at once.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
import dataclasses
from dataclasses import dataclass

from airflow_provider_logbus.targets.base import BatchRecord
from airflow_provider_logbus.targets.iceberg_batches import COMPACTION, HOUR_MS, hour_field, hour_reader
from airflow_provider_logbus.targets.iceberg_ledger import COMPACTION as LEDGER_COMPACTION
from airflow_provider_logbus.targets.iceberg_ledger import LedgerEntry
from airflow_provider_logbus.targets.iceberg_tables import small_types

logger = logging.getLogger(__name__)

TARGET_FILE_BYTES = 128 << 20  # Iceberg's write.target-file-size-bytes default (512 MiB) is for bigger tables
ATTEMPTS = 5
COMPACTED_DIR = "_logbus_compacted"


@dataclass(frozen=True)
class HourCompaction:
    """What the compaction did with one hour."""

    hour_ms: int
    files_before: int
    files_after: int
    rows: int
    outcome: str  # "compacted", "left: <why>"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class NotAccountable(Exception):
    """The hour's rows cannot be accounted to batches; the message says why."""


def compact_hours(target, closed_before_ms: int, target_file_bytes: int = TARGET_FILE_BYTES,
                  since_ms: int | None = None) -> list[HourCompaction]:
    """Compact every hour before `closed_before_ms` (and from `since_ms`) that has more
    files than ceil(bytes / target_file_bytes). `target` is an `IcebergTarget`."""
    table = target.table_or_fail()
    hours = _hours_to_compact(table, closed_before_ms, target_file_bytes, since_ms)
    contents = target.contents_of(table) if hours else None  # one read of every file's batch for all hours
    done, accounts = [], []
    for hour_ms in hours:
        done.append(compact_hour(target, hour_ms, target_file_bytes, contents=contents, accounts=accounts))
    if accounts:  # one ledger append for the run; a crash before it is made good by the next `sync_ledger`
        target.ledger.append(accounts)
    return done


def compact_hour(target, hour_ms: int, target_file_bytes: int = TARGET_FILE_BYTES, *, contents=None,
                 accounts: list[LedgerEntry] | None = None) -> HourCompaction:
    """Compact one hour. `contents` (`IcebergTarget.contents_of` of a recent snapshot)
    spares reading every file's batch again: other hours' compactions do not change this
    hour's, and when a load changed it meanwhile the accounting disagrees and the hour
    is read afresh. The ledger entry goes into `accounts` when given (appended by the
    caller), else into the ledger at once."""
    from pyiceberg.exceptions import CommitFailedException

    for attempt in range(1, ATTEMPTS + 1):
        table = target.table_or_fail()
        entries = _entries_by_hour(table, hour_ms).get(hour_ms, [])
        needed = _files_needed(entries, target_file_bytes)
        if len(entries) <= needed:
            return HourCompaction(hour_ms, len(entries), len(entries), 0, "left: already compact")
        try:
            try:
                rows, labels, account = _accounted_rows(contents or target.contents_of(table), table, hour_ms, entries)
            except NotAccountable:
                if contents is None:
                    raise
                contents = None  # read before a load added to the hour: account it afresh
                rows, labels, account = _accounted_rows(target.contents_of(table), table, hour_ms, entries)
        except NotAccountable as exc:
            logger.warning("%s: hour %d not compacted: %s", target.identifier, hour_ms, exc)
            return HourCompaction(hour_ms, len(entries), len(entries), 0, f"left: {exc}")
        written = _write_files(table, hour_ms, rows, labels, account, needed)
        try:
            snapshot_id = _replace(table, entries, written, hour_ms)
        except CommitFailedException:
            _delete(table, written)
            logger.info("%s: a commit came first while compacting hour %d (attempt %d); reading it again",
                        target.identifier, hour_ms, attempt)
            continue
        except BaseException:
            _delete(table, written)
            raise
        entry = LedgerEntry(LEDGER_COMPACTION, f"{hour_ms}.{snapshot_id}", snapshot_id, "",
                            {"hour_ms": hour_ms, "files": written})
        if accounts is None:
            target.ledger.append([entry])
        else:
            accounts.append(entry)
        logger.info("%s: hour %d compacted from %d files into %d (%d rows)", target.identifier, hour_ms,
                    len(entries), len(written), rows.num_rows)
        return HourCompaction(hour_ms, len(entries), len(written), rows.num_rows, "compacted")
    return HourCompaction(hour_ms, 0, 0, 0, f"left: {ATTEMPTS} concurrent commits in a row; next run")


def _hours_to_compact(table, closed_before_ms: int, target_file_bytes: int, since_ms: int | None) -> list[int]:
    return sorted(hour for hour, entries in _entries_by_hour(table).items()
                  if hour + HOUR_MS <= closed_before_ms and (since_ms is None or hour >= since_ms)
                  and len(entries) > _files_needed(entries, target_file_bytes))


def _files_needed(entries: list, target_file_bytes: int) -> int:
    return max(1, math.ceil(sum(e.data_file.file_size_in_bytes for e in entries) / target_file_bytes))


def _entries_by_hour(table, only_hour_ms: int | None = None) -> dict[int, list]:
    """The current snapshot's live manifest entries, by the hour of their file; with
    `only_hour_ms`, only the manifests whose partition summaries may hold that hour are
    read (a day's compaction read every manifest once per hour it compacted)."""
    current = table.current_snapshot()
    may_hold = _manifests_holding(table, only_hour_ms) if only_hour_ms is not None else (lambda manifest: True)
    out: dict[int, list] = {}
    for manifest in current.manifests(table.io) if current is not None else ():
        if not may_hold(manifest):
            continue
        hour_of = hour_reader(table, manifest.partition_spec_id)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            out.setdefault(hour_of(entry.data_file), []).append(entry)
    return out


def _manifests_holding(table, hour_ms: int):
    """manifest -> False when its partition summary rules out files of the hour; a spec
    without an `hour(timestamp)` field cannot rule out anything."""
    from pyiceberg.expressions import EqualTo
    from pyiceberg.expressions.visitors import manifest_evaluator

    judges = {}
    for spec_id, spec in table.specs().items():
        found = hour_field(table, spec_id)
        if found is not None:
            judges[spec_id] = manifest_evaluator(spec, table.schema(), EqualTo(found[1].name, hour_ms // HOUR_MS))
    return lambda manifest: manifest.partition_spec_id not in judges or judges[manifest.partition_spec_id](manifest)


def _accounted_rows(contents, table, hour_ms: int, entries: list):
    """The hour's rows (in offset order), each row's batch label, and the batches' ids
    by label; raises `NotAccountable` unless every row belongs to exactly one batch and
    the batches' counts equal what their files hold."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan
    from pyiceberg.manifest import DataFileContent

    if any(e.data_file.content != DataFileContent.DATA for e in entries):
        raise NotAccountable("it has delete files")
    held: dict[str, int] = {}
    for f in contents.files:
        if f.hour_ms == hour_ms:
            if f.batch_id is None:
                raise NotAccountable(f"{f.path} came into the table outside the commit protocol")
            held[f.batch_id] = held.get(f.batch_id, 0) + f.rows
    snapshot_id = table.current_snapshot().snapshot_id
    rows = table.scan(row_filter=And(GreaterThanOrEqual("timestamp", _iso(hour_ms)),
                                     LessThan("timestamp", _iso(hour_ms + HOUR_MS))),
                      snapshot_id=snapshot_id).to_arrow()
    if rows.num_rows != sum(held.values()):
        raise NotAccountable(f"its files hold {rows.num_rows} rows of the hour, their metadata {sum(held.values())}")
    account = sorted(held)
    labels = _labels(rows, [r for r in contents.batches if r.batch_id in held], account)
    counts = {b: n for b, n in zip(account, _count(labels, len(account))) if n}
    if counts != held:
        raise NotAccountable(f"the batch ranges hold {counts} of its rows, the batches' files {held}")
    order = pc.sort_indices(rows, [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
    return rows.take(order), pa.array(labels).take(order), account


def _labels(rows, records: list[BatchRecord], account: list[str]):
    """Per row, the index in `account` of the batch whose ranges hold it."""
    import numpy as np
    import pyarrow.compute as pc

    labels = np.full(rows.num_rows, -1, dtype=np.int64)
    topic, partition, offset = rows["topic"], rows["partition"], rows["offset"]
    for record in records:
        index = account.index(record.batch_id)
        for r in record.ranges:
            mask = pc.and_(pc.and_(pc.equal(topic, r.topic), pc.equal(partition, r.partition)),
                           pc.and_(pc.greater_equal(offset, r.start), pc.less(offset, r.end)))
            hit = mask.to_numpy(zero_copy_only=False)
            if (labels[hit] != -1).any():
                raise NotAccountable(f"batch {record.batch_id}'s ranges overlap another batch's")
            labels[hit] = index
    if (labels == -1).any():
        raise NotAccountable(f"{int((labels == -1).sum())} rows lie in no batch's ranges")
    return labels


def _count(labels, n: int) -> list[int]:
    import numpy as np

    return np.bincount(labels, minlength=n).tolist()


def _write_files(table, hour_ms: int, rows, labels, account: list[str], files: int) -> dict[str, dict[str, int]]:
    """Write `rows` into `files` Parquet files of about equal size under the table's data
    directory; {path: {batch id: rows}}."""
    import numpy as np
    import pyarrow.parquet as pq

    schema = small_types(table.schema().as_arrow())
    rows = rows.cast(schema)
    labels = labels.to_numpy()
    per_file = math.ceil(rows.num_rows / files)
    written: dict[str, dict[str, int]] = {}
    try:
        for start in range(0, rows.num_rows, per_file):
            path = f"{table.location().rstrip('/')}/data/{COMPACTED_DIR}/hour={hour_ms // HOUR_MS}/{uuid.uuid4().hex}.parquet"
            with table.io.new_output(path).create() as stream:
                pq.write_table(rows.slice(start, per_file), stream)
            counts = np.bincount(labels[start:start + per_file], minlength=len(account)).tolist()
            written[path] = {b: n for b, n in zip(account, counts) if n}
    except BaseException:
        _delete(table, written)
        raise
    return written


def _replace(table, entries: list, written: dict[str, dict[str, int]], hour_ms: int) -> int:
    """One snapshot that deletes the hour's old files and adds the new ones, only if the
    table is still at the snapshot read; its id."""
    from pyiceberg.io.pyarrow import parquet_files_to_data_files

    from airflow_provider_logbus.targets.iceberg_transaction import replace_files, transaction

    new_files = list(parquet_files_to_data_files(table.io, table.metadata, iter(written)))
    tx = transaction(table)
    properties = {COMPACTION: json.dumps({"hour_ms": hour_ms, "files": written}, sort_keys=True)}
    with replace_files(tx, properties) as rewrite:
        for entry in entries:
            rewrite.delete_data_file(entry.data_file)
        for data_file in new_files:
            rewrite.append_data_file(data_file)
        snapshot_id = rewrite.snapshot_id
    tx.commit_transaction()
    return snapshot_id


def _delete(table, written: dict) -> None:
    for path in written:
        try:
            table.io.delete(path)
        except Exception as exc:  # the orphan removal deletes it later
            logger.warning("could not delete %s: %s", path, exc)


def _iso(ms: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat()
