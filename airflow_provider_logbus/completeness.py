"""The completeness audit (docs/provider.md, "The audit"), pure computation: produced
(producer monitoring events) against loaded (committed batch records), per topic and
hour.

A window belongs to the hour of its start; producers count per window of the message
timestamp, the load job counts per 10-minute window of the same timestamp, so both
sides bucket a message into the same hour.
"""

from __future__ import annotations

from datetime import datetime, timezone

from airflow_provider_logbus.targets.base import BatchRecord

HOUR_MS = 3_600_000


def utc_minute(ms: int) -> str:
    """Epoch milliseconds as the ISO-8601 UTC minute reports and announcements use:
    `2024-01-01T10:00Z` (hours are what people read; the milliseconds stay in the data)."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def _by_window(records: list[BatchRecord], field: str) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for record in records:
        for c in getattr(record, field) or []:
            key = (c["topic"], int(c["window_start"]))
            out[key] = out.get(key, 0) + int(c["count"])
    return out


def build_report(table: str, topic: str, start_ms: int, end_ms: int, produced: dict[tuple[str, int], int],
                 batches: list[BatchRecord], threshold: float) -> dict:
    """The report of `topic` loaded into `table` for [start_ms, end_ms):
    per hour, produced = loaded + rejected + missing (or − duplicated)."""

    def hourly(counts: dict[tuple[str, int], int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for (t, window), n in counts.items():
            if t == topic and start_ms <= window < end_ms:
                hour = window - window % HOUR_MS
                out[hour] = out.get(hour, 0) + n
        return out

    produced_h = hourly(produced)
    loaded_h, rejected_h = hourly(_by_window(batches, "counts")), hourly(_by_window(batches, "rejected"))
    hours = []
    for hour in sorted(set(produced_h) | set(loaded_h) | set(rejected_h)
                       | set(range(start_ms - start_ms % HOUR_MS, end_ms, HOUR_MS))):
        if hour + HOUR_MS <= start_ms or hour >= end_ms:
            continue
        p, l, rj = produced_h.get(hour, 0), loaded_h.get(hour, 0), rejected_h.get(hour, 0)
        hours.append({
            "hour": utc_minute(hour), "hour_ms": hour, "produced": p, "loaded": l, "rejected": rj,
            "missing": max(p - l - rj, 0), "duplicated": max(l + rj - p, 0),
            "completeness": (min(p, l + rj) / p) if p else 1.0,
        })
    total = {k: sum(h[k] for h in hours) for k in ("produced", "loaded", "rejected", "missing", "duplicated")}
    gaps = offset_gaps(batches, topic)
    return {
        "table": table, "topic": topic, "start": utc_minute(start_ms), "end": utc_minute(end_ms),
        "start_ms": start_ms, "end_ms": end_ms, "threshold": threshold, **total,
        "completeness": (total["produced"] - total["missing"]) / total["produced"] if total["produced"] else 1.0,
        "hours": hours, "data_loss": data_losses(batches, topic), "offset_gaps": gaps,
        "overlaps": [g for g in gaps if g["kind"] == "overlap"],
        "batches": [r.batch_id for r in batches],
    }


def judge(report: dict, now_ms: int, grace_ms: int) -> dict:
    """Set the report's and each hour's `status`: "failed" on any duplicate (duplicated
    rows, or batches whose ranges overlap — duplicates never heal, so no grace applies),
    or under the threshold once `grace_ms` has passed since the end; "pending" under the
    threshold before that (late data may still come); else "ok". An hour is "complete"
    when it is at or above the threshold, has no duplicate, and its grace has passed."""
    threshold = float(report["threshold"])
    for h in report["hours"]:
        past_grace = now_ms >= h["hour_ms"] + HOUR_MS + grace_ms
        if h["duplicated"]:
            h["status"] = "duplicated"
        elif h["completeness"] >= threshold:
            h["status"] = "complete" if past_grace else "pending"
        else:
            h["status"] = "incomplete" if past_grace else "pending"
    reasons = []
    if report["duplicated"] or report["overlaps"]:
        reasons.append(f"{report['duplicated']} duplicated row(s)" + "".join(
            f"; partition {o['partition']} bytes [{o['start']}, {o['end']}) loaded by both batch {o['after']} "
            f"and batch {o['before']}" for o in report["overlaps"]))
    below = report["completeness"] < threshold
    past_grace = now_ms >= report["end_ms"] + grace_ms
    if below and past_grace:
        reasons.append(f"completeness {report['completeness']:.4%} under the threshold {threshold:.4%} "
                       f"({report['missing']} missing)")
    report["status"] = "failed" if reasons else ("pending" if below else "ok")
    report["reasons"] = reasons
    return report


def newly_complete_hours(report: dict, complete_through_ms: int | None) -> list[dict]:
    """The hours to announce: complete ones, contiguous from the watermark (or from the
    report's first hour when there is none). An incomplete or pending hour stops the run,
    so an hour is announced once, and never before every hour before it is complete.
    Complete hours without any message are passed over, not announced (a table loaded
    after a long pause would otherwise announce every empty hour in between)."""
    out = []
    for h in report["hours"]:
        if complete_through_ms is not None and h["hour_ms"] < complete_through_ms:
            continue
        if h["status"] != "complete":
            break
        if h["produced"] or h["loaded"] or h["rejected"]:
            out.append(h)
    return out


def announce_complete_hours(target, topic: str, produced: dict[tuple[str, int], int],
                            batches: list[BatchRecord], threshold: float, now_ms: int, grace_ms: int,
                            until_ms: int, run_id: str, attempts: int = 20) -> list[dict]:
    """Claim the hours that became complete, up to `until_ms`, from the table's watermark
    (or from the first hour the table holds). The audit of any interval looks at every
    hour since the watermark, so runs that finish out of order (a backfill) still
    announce each hour once and in order; the claim is a compare-and-swap on the
    table's announcement, so of two concurrent audits only one announces an hour."""
    windows = [int(c["window_start"]) for b in batches for c in b.counts if c["topic"] == topic]
    for _ in range(attempts):
        current = target.announcement()
        start = int(current["complete_through_ms"]) if current else (min(windows) if windows else None)
        if start is None or start >= until_ms:
            return []
        start -= start % HOUR_MS
        report = judge(build_report(target.table, topic, start, until_ms, produced, batches, threshold),
                       now_ms, grace_ms)
        hours = newly_complete_hours(report, start)
        if not hours:
            return []
        new = {"complete_through_ms": hours[-1]["hour_ms"] + HOUR_MS, "run_id": run_id,
               "hours": [h["hour"] for h in hours]}
        if target.announce(current, new):
            return hours
    return []


def data_losses(batches: list[BatchRecord], topic: str) -> list[dict]:
    """Byte ranges retention deleted before they were loaded (on_data_loss="skip")."""
    return [
        {"batch_id": record.batch_id, "partition": r.partition, "lost_start": r.lost_start,
         "lost_end": r.lost_end, "bytes": r.lost_end - r.lost_start}
        for record in batches for r in record.ranges if r.topic == topic and r.lost_start is not None
    ]


def offset_gaps(batches: list[BatchRecord], topic: str) -> list[dict]:
    """Holes and overlaps between the batches' ranges of each partition (a recorded loss
    is not a hole: the range starts past the lost bytes on purpose). Ranges are walked in
    start order against the furthest end seen so far, so an overlap is found whichever
    batches it involves."""
    per_partition: dict[int, list[tuple[int, int, bool, str]]] = {}
    for record in batches:
        for r in record.ranges:
            if r.topic == topic and r.end > r.start:
                per_partition.setdefault(r.partition, []).append((r.start, r.end, r.lost_start is not None,
                                                                  record.batch_id))
    gaps = []
    for p, ranges in sorted(per_partition.items()):
        ranges.sort()
        reach, reached_by = ranges[0][1], ranges[0][3]
        for start, end, lost, batch_id in ranges[1:]:
            if start > reach and not lost:
                gaps.append({"partition": p, "kind": "hole", "start": reach, "end": start,
                             "after": reached_by, "before": batch_id})
            elif start < reach:
                gaps.append({"partition": p, "kind": "overlap", "start": start, "end": min(end, reach),
                             "after": reached_by, "before": batch_id})
            if end > reach:
                reach, reached_by = end, batch_id
    return gaps


def format_report(report: dict) -> str:
    """A readable table for the task log and the demo."""
    lines = [
        f"logbus audit: topic {report['topic']} -> table {report['table']}, {report['start']} .. {report['end']}",
        f"{'hour (UTC)':<18} {'produced':>10} {'loaded':>10} {'rejected':>9} {'missing':>9} {'duplicated':>10} "
        f"{'complete':>9}  status",
    ]
    for h in report["hours"]:
        lines.append(f"{h['hour']:<18} {h['produced']:>10} {h['loaded']:>10} {h.get('rejected', 0):>9} "
                     f"{h['missing']:>9} {h['duplicated']:>10} {h['completeness'] * 100:>8.2f}%  {h.get('status', '')}")
    lines.append(f"{'total':<18} {report['produced']:>10} {report['loaded']:>10} {report.get('rejected', 0):>9} "
                 f"{report['missing']:>9} {report['duplicated']:>10} {report['completeness'] * 100:>8.2f}%  "
                 f"{report.get('status', '')}")
    for loss in report["data_loss"]:
        lines.append(f"data loss: partition {loss['partition']} bytes [{loss['lost_start']}, {loss['lost_end']}) "
                     f"deleted by retention before batch {loss['batch_id']}")
    for gap in report["offset_gaps"]:
        lines.append(f"offset {gap['kind']}: partition {gap['partition']} [{gap['start']}, {gap['end']}) "
                     f"between batches {gap['after']} and {gap['before']}")
    lines.extend(f"FAILED: {reason}" for reason in report.get("reasons", []))
    return "\n".join(lines)
