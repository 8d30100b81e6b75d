"""The completeness audit (DESIGN §7), pure computation: produced (producer monitoring
events) against loaded (committed batch records), per topic and hour.

A window belongs to the hour of its start; producers count per window of the message
timestamp, the load job counts per 10-minute window of the same timestamp, so both
sides bucket a message into the same hour.
"""

from __future__ import annotations

from datetime import datetime, timezone

from airflow_provider_logbus.warehouse import BatchRecord

HOUR_MS = 3_600_000


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def build_report(table: str, topic: str, start_ms: int, end_ms: int, produced: dict[tuple[str, int], int],
                 batches: list[BatchRecord], threshold: float) -> dict:
    """The report of `topic` loaded into `table` for [start_ms, end_ms)."""
    loaded: dict[tuple[str, int], int] = {}
    for record in batches:
        for c in record.counts:
            key = (c["topic"], int(c["window_start"]))
            loaded[key] = loaded.get(key, 0) + int(c["count"])

    def hourly(counts: dict[tuple[str, int], int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for (t, window), n in counts.items():
            if t == topic and start_ms <= window < end_ms:
                hour = window - window % HOUR_MS
                out[hour] = out.get(hour, 0) + n
        return out

    produced_h, loaded_h = hourly(produced), hourly(loaded)
    hours = []
    for hour in sorted(set(produced_h) | set(loaded_h) | set(range(start_ms - start_ms % HOUR_MS, end_ms, HOUR_MS))):
        if hour + HOUR_MS <= start_ms or hour >= end_ms:
            continue
        p, l = produced_h.get(hour, 0), loaded_h.get(hour, 0)
        hours.append({
            "hour": _iso(hour), "hour_ms": hour, "produced": p, "loaded": l,
            "missing": max(p - l, 0), "duplicated": max(l - p, 0),
            "completeness": (min(p, l) / p) if p else 1.0,
        })
    total_p = sum(h["produced"] for h in hours)
    total_l = sum(h["loaded"] for h in hours)
    missing = sum(h["missing"] for h in hours)
    duplicated = sum(h["duplicated"] for h in hours)
    completeness = (total_p - missing) / total_p if total_p else 1.0
    return {
        "table": table, "topic": topic, "start": _iso(start_ms), "end": _iso(end_ms),
        "start_ms": start_ms, "end_ms": end_ms, "threshold": threshold,
        "produced": total_p, "loaded": total_l, "missing": missing, "duplicated": duplicated,
        "completeness": completeness, "hours": hours,
        "data_loss": data_losses(batches, topic), "offset_gaps": offset_gaps(batches, topic),
        "batches": [r.batch_id for r in batches],
    }


def data_losses(batches: list[BatchRecord], topic: str) -> list[dict]:
    """Byte ranges retention deleted before they were loaded (on_data_loss="skip")."""
    return [
        {"batch_id": r.batch_id, "partition": int(x["partition"]), "lost_start": int(x["lost_start"]),
         "lost_end": int(x["lost_end"]), "bytes": int(x["lost_end"]) - int(x["lost_start"])}
        for r in batches for x in r.ranges if x["topic"] == topic and x.get("lost_start") is not None
    ]


def offset_gaps(batches: list[BatchRecord], topic: str) -> list[dict]:
    """Holes and overlaps between consecutive batches' ranges of a partition (a recorded
    loss is not a hole: the next range starts at the earliest offset on purpose)."""
    per_partition: dict[int, list[tuple[int, int, int | None, str]]] = {}
    for r in batches:
        for x in r.ranges:
            if x["topic"] == topic and int(x["end"]) > int(x["start"]):
                per_partition.setdefault(int(x["partition"]), []).append(
                    (int(x["start"]), int(x["end"]), x.get("lost_start"), r.batch_id))
    gaps = []
    for p, ranges in sorted(per_partition.items()):
        ranges.sort()
        for (s1, e1, _, b1), (s2, e2, lost2, b2) in zip(ranges, ranges[1:]):
            if s2 > e1 and lost2 is None:
                gaps.append({"partition": p, "kind": "hole", "start": e1, "end": s2, "after": b1, "before": b2})
            elif s2 < e1:
                gaps.append({"partition": p, "kind": "overlap", "start": s2, "end": e1, "after": b1, "before": b2})
    return gaps


def format_report(report: dict) -> str:
    """A readable table for the task log and the demo."""
    lines = [
        f"logbus audit: topic {report['topic']} -> table {report['table']}, {report['start']} .. {report['end']}",
        f"{'hour (UTC)':<18} {'produced':>10} {'loaded':>10} {'missing':>9} {'duplicated':>10} {'complete':>9}",
    ]
    for h in report["hours"]:
        lines.append(f"{h['hour']:<18} {h['produced']:>10} {h['loaded']:>10} {h['missing']:>9} "
                     f"{h['duplicated']:>10} {h['completeness'] * 100:>8.2f}%")
    lines.append(f"{'total':<18} {report['produced']:>10} {report['loaded']:>10} {report['missing']:>9} "
                 f"{report['duplicated']:>10} {report['completeness'] * 100:>8.2f}%")
    for loss in report["data_loss"]:
        lines.append(f"data loss: partition {loss['partition']} bytes [{loss['lost_start']}, {loss['lost_end']}) "
                     f"deleted by retention before batch {loss['batch_id']}")
    for gap in report["offset_gaps"]:
        lines.append(f"offset {gap['kind']}: partition {gap['partition']} [{gap['start']}, {gap['end']}) "
                     f"between batches {gap['after']} and {gap['before']}")
    return "\n".join(lines)
