"""The numbers the Airflow page shows, computed by the code the audit operator runs.

`hours` is the audit's report (`batch.audit_inputs`, `completeness.build_report`,
`completeness.judge`) for a range of hours, as each audit task of the table judges it,
plus, per hour, the batches that loaded it, why it is not complete and the files outside
every batch; `lag` is the table's committed end per partition (`CommitTarget.state`)
against the broker's latest offset, and the records between them. Nothing here counts rows its own way, so the page
and the audit cannot disagree.

Bounded work per view: the monitoring topic is read from the segment holding the
range's start (minus `EVENTS_SLACK_MS`), not from its beginning; the table's contents
come from its metadata (the current snapshot's manifests, or the batch records).
No Airflow import: the page's API calls this, and tests call it directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_logbus.batch import AuditInputs, audit_inputs
from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.completeness import HOUR_MS, judge, withdrawn_hours
from airflow_provider_logbus.targets.base import BatchRecord, CommitTarget

EVENTS_SLACK_MS = 2 * HOUR_MS  # monitoring events about an hour are published during it or soon after
REJECT_ROWS = 100  # rows of a batch's rejects the page shows


@dataclass(frozen=True)
class AuditedTable:
    """A table an audit task checks, as the task is configured: what the page needs to
    compute the numbers exactly as that task does."""

    dag_id: str
    task_id: str
    table: str
    topic: str
    target: str  # "directory" or "iceberg"
    warehouse: str | None
    catalog_conn_id: str
    logbus_conn_id: str
    threshold: float
    grace_ms: int
    monitoring_topic: str
    load_dag_id: str = ""  # the DAG whose commit task loads the table (its runs are the batches' runs)

    @property
    def key(self) -> str:
        return f"{self.dag_id}.{self.task_id}"


@dataclass(frozen=True)
class PageTable:
    """One table on the page and the audit tasks that check it against the same topic
    and monitoring events (an hourly and a daily audit of one table are one entry). The
    first audit's verdicts colour the page — the one in the DAG that loads the table,
    when the user may read it — and every audit's verdict is given beside each hour."""

    audits: tuple[AuditedTable, ...]

    @property
    def primary(self) -> AuditedTable:
        return self.audits[0]

    @property
    def key(self) -> str:
        return self.primary.key

    def as_json(self) -> dict:
        """The API's description: the primary audit's settings, and every audit's."""
        return {**self.primary.__dict__, "key": self.key, "audits": [
            {"dag_id": a.dag_id, "task_id": a.task_id, "key": a.key, "threshold": a.threshold,
             "grace_ms": a.grace_ms} for a in self.audits]}


def display_status(hour: dict) -> str:
    """The audit's verdict of an hour (`completeness.judge`), with "no data" for an hour
    no tier counted anything in."""
    if hour["status"] == "complete" and not (hour["produced"] or hour["loaded"] or hour["rejected"]):
        return "no data"
    return hour["status"]


def hours(table: PageTable, cluster: LogbusCluster, target: CommitTarget, start_ms: int, end_ms: int,
          now_ms: int) -> dict:
    """`page_report` of [start_ms, end_ms), read from the cluster and the table now —
    the announcement first, so that every hour it covers is judged on inputs read after
    it was made."""
    start_ms -= start_ms % HOUR_MS
    announcement = target.announcement()
    inputs = audit_inputs(cluster, target, table.primary.monitoring_topic, since_ms=start_ms,
                          events_since_ms=start_ms - EVENTS_SLACK_MS)
    return page_report(table, inputs, start_ms, end_ms, now_ms, announcement)


def page_report(table: PageTable, inputs: AuditInputs, start_ms: int, end_ms: int, now_ms: int,
                announcement: dict | None) -> dict:
    """The first audit's report of [start_ms, end_ms), each hour with its display status,
    every audit's verdict (`verdicts`), its batches, and — from the report — why it is
    not complete (`reasons`) and the files outside every batch (`outside_batches`, with
    the snapshot that added each). `complete_through_ms` is the announced watermark, or
    the first announced hour of the range that is no longer complete (`withdrawn`): the
    page does not show as complete what the next audit will withdraw."""
    primary = table.primary
    reports = [judge(inputs.report(primary.table, primary.topic, start_ms, end_ms, audit.threshold), now_ms,
                     audit.grace_ms) for audit in table.audits]
    report = reports[0]
    by_hour = batches_by_hour(inputs.batches, primary.topic)
    for i, hour in enumerate(report["hours"]):
        hour["display_status"] = display_status(hour)
        hour["verdicts"] = [{"audit": audit.key, "status": display_status(judged["hours"][i])}
                            for audit, judged in zip(table.audits, reports)]
        hour["batches"] = by_hour.get(hour["hour_ms"], [])
        for outside in hour.get("outside_batches", ()):  # a string: Iceberg's ids lose digits in JavaScript
            outside["snapshot_id"] = None if outside["snapshot_id"] is None else str(outside["snapshot_id"])
    report["audits"] = [{"audit": audit.key, "status": judged["status"], "reasons": judged["reasons"]}
                        for audit, judged in zip(table.audits, reports)]
    announced = int(announcement["complete_through_ms"]) if announcement else None
    withdrawn = withdrawn_hours(report, announced) if announced is not None else []
    report["announced_through_ms"] = announced
    report["complete_through_ms"] = withdrawn[0]["hour_ms"] if withdrawn else announced
    report["withdrawn"] = [{k: h[k] for k in ("hour", "hour_ms", "status")} for h in withdrawn]
    report["withdrawal"] = ({k: announcement.get(k) for k in ("run_id", "withdrawn", "withdrawn_from_ms")}
                            if announcement and announcement.get("withdrawn") else None)
    return report


def batches_by_hour(batches: list[BatchRecord], topic: str) -> dict[int, list[dict]]:
    """hour (ms) -> the batches with rows (loaded or rejected) of `topic` in that hour."""
    out: dict[int, list[dict]] = {}
    for record in batches:
        rows = _hourly(record.counts, topic)
        rejected = _hourly(record.rejected, topic)
        for hour in sorted(set(rows) | set(rejected)):
            out.setdefault(hour, []).append({
                "batch_id": record.batch_id, "run_id": record.run_id,
                "interval_start": record.interval_start, "interval_end": record.interval_end,
                # a string: Iceberg's 64-bit ids lose digits as JavaScript numbers
                "snapshot_id": None if record.extra.get("snapshot_id") is None else str(record.extra["snapshot_id"]),
                "committed_at": record.committed_at,
                "rows": rows.get(hour, 0), "rejected": rejected.get(hour, 0),
                "batch_rows": record.row_count, "batch_rejected": record.rejected_count,
                "ranges": [{"partition": r.partition, "start": r.start, "end": r.end}
                           for r in record.ranges if r.topic == topic],
            })
    return out


def _hourly(windows: list[dict], topic: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for w in windows:
        if w["topic"] == topic:
            hour = int(w["window_start"]) - int(w["window_start"]) % HOUR_MS
            out[hour] = out.get(hour, 0) + int(w["count"])
    return out


def lag(table: AuditedTable, cluster: LogbusCluster, target: CommitTarget, now_ms: int) -> list[dict]:
    """Per partition of the topic: the table's committed end against the broker's latest
    offset, the records between them (`lag_records`, counted by the partition's leader:
    offsets are not dense), and how far behind in time — now minus the end of the last
    interval a batch loaded of that partition, when records are left to load."""
    ends = target.state().ends
    loaded_through: dict[int, int] = {}
    for record in target.batches():
        end_ms = _iso_ms(record.interval_end)
        for r in record.ranges:
            if r.topic == table.topic and end_ms is not None:
                loaded_through[r.partition] = max(loaded_through.get(r.partition, 0), end_ms)
    partitions = cluster.partition_offsets(table.topic)
    committed = {partition: end for (topic, partition), end in ends.items() if topic == table.topic}
    records = cluster.lag_behind(table.topic, committed, partitions)
    rows = []
    for partition, offsets in sorted(partitions.items()):
        through = loaded_through.get(partition)
        rows.append({
            "partition": partition, "leader": offsets.leader, "committed": committed.get(partition),
            "latest": offsets.latest, "lag_records": records[partition], "loaded_through_ms": through,
            "behind_ms": (max(now_ms - through, 0) if through is not None else None) if records[partition] else 0,
        })
    return rows


def reject_rows(target: CommitTarget, batch_id: str, limit: int = REJECT_ROWS) -> dict:
    """The first `limit` values batch `batch_id` rejected, with why, and where they are
    (on a disk or in the table's bucket: `target.storage`)."""
    files = target.reject_files(batch_id)
    rows: list[dict] = []
    for path in files:
        if len(rows) >= limit:
            break
        data = target.storage.read_parquet(path, columns=["partition", "offset", "timestamp", "value", "error"])
        for row in data.slice(0, limit - len(rows)).to_pylist():
            value = row["value"]
            rows.append({"partition": row["partition"], "offset": row["offset"],
                         "timestamp": row["timestamp"].isoformat() if row["timestamp"] else None,
                         "value": value.decode("utf-8", "replace")[:200] if value is not None else None,
                         "error": row["error"]})
    return {"batch_id": batch_id, "files": files, "rows": rows}


def _iso_ms(text: str) -> int | None:
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except (TypeError, ValueError):
        return None
