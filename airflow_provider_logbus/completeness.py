"""The completeness audit (docs/provider.md, "The audit"), pure computation: what each
tier a message passes counted, per topic and hour, and the tier where messages went
missing or were duplicated.

The tiers, in order: `producer` (the producers' monitoring events), `mirror` (a mirror's
events, per source cluster; only for a topic some mirror reported on), `table` (the rows
the table holds, from its metadata, plus the rejected values its batch records count).
Each tier is compared with the one before it. The table tier is also compared with its
own batch records: rows the table holds that no batch record claims (a file added by
hand), or rows a record claims that the table lacks, fail the hour at once, naming the
files that are not a logbus batch's.

A window belongs to the hour of its start; producers and mirrors count per window of the
message timestamp, the load job per 10-minute window of the same timestamp, and the
table is partitioned by the hour of that timestamp, so every tier buckets a message into
the same hour.
"""

from __future__ import annotations

from datetime import datetime, timezone

from airflow_provider_logbus.targets.base import BatchRecord, TableFile

HOUR_MS = 3_600_000
PRODUCER, MIRROR, TABLE = "producer", "mirror", "table"
TOTALS = ("produced", "loaded", "recorded", "rejected", "missing", "duplicated")


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


def _held(files: list[TableFile], batches: list[BatchRecord], topic: str) -> dict[tuple[str | None, int], int]:
    """Rows the table holds per (batch id, hour) for `topic`: a batch's files hold its
    topic; a file outside every batch (batch id None) is counted for the audited topic,
    as a table holds one topic."""
    topics = {r.batch_id: {x.topic for x in r.ranges} | {c["topic"] for c in r.counts} for r in batches}
    out: dict[tuple[str | None, int], int] = {}
    for f in files:
        if f.batch_id is None or topic in topics.get(f.batch_id, ()):
            out[(f.batch_id, f.hour_ms)] = out.get((f.batch_id, f.hour_ms), 0) + f.rows
    return out


def build_report(table: str, topic: str, start_ms: int, end_ms: int, produced: dict[tuple[str, int], int],
                 batches: list[BatchRecord], threshold: float, *,
                 mirrored: dict[str | None, dict[tuple[str, int], int]] | None = None,
                 files: list[TableFile] | None = None) -> dict:
    """The report of `topic` loaded into `table` for [start_ms, end_ms): per hour, each
    tier's count, and missing / duplicated rows per tier. `mirrored` holds a mirror's
    counts per source; `files` the table's data files (`CommitTarget.contents`) — without
    them the table tier is what the batch records claim."""

    def hourly(counts: dict[tuple[str, int], int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for (t, window), n in counts.items():
            if t == topic and start_ms <= window < end_ms:
                hour = window - window % HOUR_MS
                out[hour] = out.get(hour, 0) + n
        return out

    sources = sorted((s for s, counts in (mirrored or {}).items() if any(t == topic for t, _ in counts)),
                     key=str)
    mirrored_h = {s: hourly(mirrored[s]) for s in sources}
    produced_h, rejected_h = hourly(produced), hourly(_by_window(batches, "rejected"))
    recorded_per_batch = {(r.batch_id, hour): n for r in batches
                          for hour, n in hourly(_by_window([r], "counts")).items()}
    held_per_batch = _held(files, batches, topic) if files is not None else recorded_per_batch
    recorded_h: dict[int, int] = {}
    held_h: dict[int, int] = {}
    for (_, hour), n in recorded_per_batch.items():
        recorded_h[hour] = recorded_h.get(hour, 0) + n
    for (_, hour), n in held_per_batch.items():
        held_h[hour] = held_h.get(hour, 0) + n
    hours = []
    for hour in sorted(set(produced_h) | set(recorded_h) | set(held_h) | set(rejected_h)
                       | {h for counts in mirrored_h.values() for h in counts}
                       | set(range(start_ms - start_ms % HOUR_MS, end_ms, HOUR_MS))):
        if hour + HOUR_MS <= start_ms or hour >= end_ms:
            continue
        p, rj = produced_h.get(hour, 0), rejected_h.get(hour, 0)
        held, recorded = held_h.get(hour, 0), recorded_h.get(hour, 0)
        tiers = [{"tier": PRODUCER, "count": p}]
        if sources:
            by_source = {str(s): mirrored_h[s].get(hour, 0) for s in sources}
            tiers.append({"tier": MIRROR, "count": sum(by_source.values()), "sources": by_source})
        tiers.append({"tier": TABLE, "count": held + rj, "loaded": held, "recorded": recorded, "rejected": rj})
        for before, tier in zip(tiers, tiers[1:]):
            tier["missing"], tier["duplicated"] = max(before["count"] - tier["count"], 0), max(
                tier["count"] - before["count"], 0)
        missing, duplicated = sum(t.get("missing", 0) for t in tiers), sum(t.get("duplicated", 0) for t in tiers)
        hours.append({
            "hour": utc_minute(hour), "hour_ms": hour, "produced": p,
            "mirrored": tiers[1]["count"] if sources else None, "loaded": held, "recorded": recorded, "rejected": rj,
            "missing": missing, "duplicated": duplicated, "unrecorded": held - recorded,
            "missing_at": [t["tier"] for t in tiers if t.get("missing")],
            "duplicated_at": [t["tier"] for t in tiers if t.get("duplicated")],
            "completeness": max(p - missing, 0) / p if p else 1.0, "tiers": tiers,
            **(_unrecorded(hour, files, held_per_batch, recorded_per_batch) if held != recorded else {}),
        })
    total = {k: sum(h[k] for h in hours) for k in TOTALS}
    gaps = offset_gaps(batches, topic)
    return {
        "table": table, "topic": topic, "start": utc_minute(start_ms), "end": utc_minute(end_ms),
        "start_ms": start_ms, "end_ms": end_ms, "threshold": threshold, **total,
        "unrecorded": sum(abs(h["unrecorded"]) for h in hours),  # rows where table and records differ
        "tiers": [PRODUCER, *([MIRROR] if sources else []), TABLE], "sources": [str(s) for s in sources],
        "mirrored": sum(h["mirrored"] for h in hours) if sources else None,
        "completeness": (total["produced"] - total["missing"]) / total["produced"] if total["produced"] else 1.0,
        "hours": hours, "data_loss": data_losses(batches, topic), "offset_gaps": gaps,
        "overlaps": [g for g in gaps if g["kind"] == "overlap"],
        "batches": [r.batch_id for r in batches],
    }


def _unrecorded(hour: int, files: list[TableFile] | None, held: dict, recorded: dict) -> dict:
    """Why an hour's table holds other rows than its batch records claim: the files of
    that hour no logbus batch published, and the batches whose files hold other counts
    than their records."""
    outside = [{"path": f.path, "rows": f.rows, "snapshot_id": f.snapshot_id}
               for f in files or () if f.hour_ms == hour and f.batch_id is None]
    batches = sorted({b for b, h in (*held, *recorded) if h == hour and b is not None})
    off = [{"batch_id": b, "recorded": recorded.get((b, hour), 0), "held": held.get((b, hour), 0)}
           for b in batches if recorded.get((b, hour), 0) != held.get((b, hour), 0)]
    return {"outside_batches": outside, "batches_off": off}


def judge(report: dict, now_ms: int, grace_ms: int) -> dict:
    """Set the report's and each hour's `status`: "failed" on any duplicate at any tier
    (duplicated rows, or batches whose ranges overlap) and on a table whose rows differ
    from its batch records — neither heals, so no grace applies — or under the threshold
    once `grace_ms` has passed since the end; "pending" under the threshold before that
    (late data may still come); else "ok". An hour is "complete" when it is at or above
    the threshold, has neither, and its grace has passed."""
    threshold = float(report["threshold"])
    for h in report["hours"]:
        past_grace = now_ms >= h["hour_ms"] + HOUR_MS + grace_ms
        if h["duplicated"]:
            h["status"] = "duplicated"
        elif h["unrecorded"]:
            h["status"] = "unrecorded"
        elif h["completeness"] >= threshold:
            h["status"] = "complete" if past_grace else "pending"
        else:
            h["status"] = "incomplete" if past_grace else "pending"
        h["reasons"] = _hour_reasons(h, threshold)
    reasons = []
    if report["duplicated"] or report["overlaps"]:
        reasons.append(f"{report['duplicated']} duplicated row(s)" + _where(report["hours"], "duplicated") + "".join(
            f"; partition {o['partition']} bytes [{o['start']}, {o['end']}) loaded by both batch {o['after']} "
            f"and batch {o['before']}" for o in report["overlaps"]))
    reasons.extend(_table_reason(h) for h in report["hours"] if h["unrecorded"])
    below = report["completeness"] < threshold
    past_grace = now_ms >= report["end_ms"] + grace_ms
    if below and past_grace:
        reasons.append(_below(report, report["hours"], threshold))
    report["status"] = "failed" if reasons else ("pending" if below else "ok")
    report["reasons"] = reasons
    return report


def _hour_reasons(h: dict, threshold: float) -> list[str]:
    """Why one hour is not complete, in the words of the report's reasons (the Airflow
    page shows them beside the hour)."""
    reasons = [f"{h['duplicated']} duplicated row(s)" + _where([h], "duplicated")] if h["duplicated"] else []
    if h["unrecorded"]:
        reasons.append(_table_reason(h))
    if h["completeness"] < threshold:
        reasons.append(_below(h, [h], threshold) + ("; late data may still come until its grace has passed"
                                               if h["status"] == "pending" else ""))
    return reasons


def _below(counts: dict, hours: list[dict], threshold: float) -> str:
    """`counts` (a report or an hour) under the threshold, and the tiers of `hours`
    where rows went missing."""
    return (f"completeness {counts['completeness']:.4%} under the threshold {threshold:.4%} "
            f"({counts['missing']} missing{_where(hours, 'missing')})")


def _where(hours: list[dict], kind: str) -> str:
    """` at the mirror tier (10), at the table tier (5)`: the tiers where rows went `kind`."""
    per_tier: dict[str, int] = {}
    for h in hours:
        for tier in h["tiers"]:
            if tier.get(kind):
                per_tier[tier["tier"]] = per_tier.get(tier["tier"], 0) + tier[kind]
    return "".join(f"{',' if i else ''} at the {t} tier ({n})" for i, (t, n) in enumerate(per_tier.items()))


def _table_reason(h: dict) -> str:
    """The table tier's own failure: an hour whose rows differ from its batch records."""
    text = (f"hour {h['hour']}: the table holds {h['loaded']} row(s) where its batch records claim "
            f"{h['recorded']} (table tier)")
    if h.get("outside_batches"):
        text += "; not from a logbus batch: " + ", ".join(f"{f['path']} ({f['rows']} rows)"
                                                          for f in h["outside_batches"])
    if h.get("batches_off"):
        text += "; batches whose files differ from their records: " + ", ".join(
            f"{b['batch_id']} ({b['held']} rows held, {b['recorded']} recorded)" for b in h["batches_off"])
    return text


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


# verdicts on an hour that can only come from a change of the table or of what the
# producers reported (`pending` is not one: an audit with a longer grace finds an hour
# another audit announced still pending)
WITHDRAWING = ("duplicated", "unrecorded", "incomplete")


def withdrawn_hours(report: dict, complete_through_ms: int) -> list[dict]:
    """The hours of a judged `report` before the watermark — announced complete — that it
    finds duplicated, unrecorded or incomplete now: rows were added to the table or taken
    from it since."""
    return [h for h in report["hours"] if h["hour_ms"] < complete_through_ms and h["status"] in WITHDRAWING]


def withdraw_hours(target, report: dict, run_id: str, attempts: int = 20) -> list[dict]:
    """Move the table's watermark back to the first announced hour `report` no longer
    finds complete, recording which hours were withdrawn: downstream readers of
    `logbus.complete-through` see the fall, and the audits announce the withdrawn hours
    again once complete (the hours between them that still hold are passed without a
    second Asset event: `stood_announced`). A compare-and-swap, like the announcement;
    returns the withdrawn hours ([] when every announced hour in `report` still holds).
    `report` must cover only hours announced before its inputs were read: an hour
    announced since could look incomplete on those older inputs."""
    for _ in range(attempts):
        current = target.announcement()
        if not current:
            return []
        through = int(current["complete_through_ms"])
        hours = withdrawn_hours(report, through)
        if not hours:
            return []
        new = {"complete_through_ms": hours[0]["hour_ms"], "run_id": run_id, "hours": [],
               "withdrawn": [h["hour"] for h in hours], "withdrawn_from_ms": through}
        if target.announce(current, new):
            return hours
    raise RuntimeError(f"could not withdraw hours of {target.table}: the announcement kept changing "
                       f"({attempts} attempts)")


def note_withdrawn(report: dict, hours: list[dict], was_through_ms: int | None) -> None:
    """Put the announced hours an audit withdrew (`withdraw_hours`) into its report —
    `withdrawn_hours`, and a reason each, which fail it — so that the alert says which
    hour was taken back and why."""
    report["withdrawn_hours"] = [{k: h[k] for k in ("hour", "hour_ms", "status", "reasons")} for h in hours]
    if not hours:
        return
    report["reasons"].extend(f"hour {h['hour']} was announced complete and is now {h['status']} "
                             f"({'; '.join(h['reasons'])})" for h in hours)
    report["reasons"].append(f"complete-through falls back from {utc_minute(was_through_ms)} to {hours[0]['hour']}: "
                             "the withdrawn hours are announced again once complete")
    report["status"] = "failed"


def announce_complete_hours(target, topic: str, produced: dict[tuple[str, int], int],
                            batches: list[BatchRecord], threshold: float, now_ms: int, grace_ms: int,
                            until_ms: int, run_id: str, attempts: int = 20, *,
                            mirrored: dict[str | None, dict[tuple[str, int], int]] | None = None,
                            files: list[TableFile] | None = None) -> list[dict]:
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
        report = judge(build_report(target.table, topic, start, until_ms, produced, batches, threshold,
                                    mirrored=mirrored, files=files), now_ms, grace_ms)
        hours = newly_complete_hours(report, start)
        if not hours:
            return []
        fresh = [h for h in hours if not stood_announced(current, h)]
        new = {"complete_through_ms": hours[-1]["hour_ms"] + HOUR_MS, "run_id": run_id,
               "hours": [h["hour"] for h in fresh], **still_withdrawn(current, hours[-1]["hour_ms"] + HOUR_MS)}
        if target.announce(current, new):
            return fresh
    return []


def stood_announced(current: dict | None, hour: dict) -> bool:
    """Whether `hour` was announced and is still complete, though a withdrawal of an
    earlier hour moved the watermark back below it: passing it again needs no second
    Asset event (its consumers already ran on data that has not changed)."""
    return (bool(current) and hour["hour_ms"] < int(current.get("withdrawn_from_ms", 0))
            and hour["hour"] not in current.get("withdrawn", ()))


def still_withdrawn(current: dict | None, through_ms: int) -> dict:
    """The withdrawal an announcement carries on until the watermark is back where it
    was, so that a re-announcement cut short by an incomplete hour still spares the
    hours announced before."""
    if current and through_ms < int(current.get("withdrawn_from_ms", 0)):
        return {"withdrawn": current["withdrawn"], "withdrawn_from_ms": current["withdrawn_from_ms"]}
    return {}


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
    """A readable table for the task log and the demo: every tier's count, and the tiers
    where rows went missing or were duplicated."""
    mirror = report.get("mirrored") is not None
    lines = [
        f"logbus audit: topic {report['topic']} -> table {report['table']}, {report['start']} .. {report['end']}"
        f" (tiers: {' -> '.join(report.get('tiers', [PRODUCER, TABLE]))})",
        f"{'hour (UTC)':<18} {'produced':>10}" + (f" {'mirrored':>10}" if mirror else "")
        + f" {'loaded':>10} {'rejected':>9} {'missing':>9} {'duplicated':>10} {'complete':>9}  status",
    ]

    def row(label: str, r: dict, where: str) -> str:
        return (f"{label:<18} {r['produced']:>10}" + (f" {r['mirrored']:>10}" if mirror else "")
                + f" {r['loaded']:>10} {r.get('rejected', 0):>9} {r['missing']:>9} {r['duplicated']:>10} "
                f"{r['completeness'] * 100:>8.2f}%  {r.get('status', '')}{where}")

    for h in report["hours"]:
        at = [f"missing at {t}" for t in h.get("missing_at", ())] + [f"duplicated at {t}"
                                                                     for t in h.get("duplicated_at", ())]
        lines.append(row(h["hour"], h, f" ({', '.join(at)})" if at and h.get("status") != "complete" else ""))
    lines.append(row("total", report, ""))
    if report.get("sources"):
        lines.append("mirrored per source: " + ", ".join(
            f"{s} {sum(t['sources'][s] for h in report['hours'] for t in h['tiers'] if t['tier'] == MIRROR)}"
            for s in report["sources"]))
    for loss in report["data_loss"]:
        lines.append(f"data loss: partition {loss['partition']} bytes [{loss['lost_start']}, {loss['lost_end']}) "
                     f"deleted by retention before batch {loss['batch_id']}")
    for gap in report["offset_gaps"]:
        lines.append(f"offset {gap['kind']}: partition {gap['partition']} [{gap['start']}, {gap['end']}) "
                     f"between batches {gap['after']} and {gap['before']}")
    lines.extend(f"FAILED: {reason}" for reason in report.get("reasons", []))
    return "\n".join(lines)
