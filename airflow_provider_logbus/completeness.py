"""The completeness audit (docs/provider.md, "The audit"), pure computation: what each
tier a message passes counted, per topic and hour, and the tier where messages went
missing or were duplicated.

The tiers, in order: `producer` (the producers' monitoring events; for a topic the brokers
count, only when some producer reported on it), `mirror` (a mirror's events, per source
cluster; only for a topic some mirror reported on), `broker` (the records the brokers
committed, counted by each partition's leader: `brokertier.py`; for a topic they count),
`table` (the rows the table holds, from its metadata, plus the rejected values its batch
records count). Each tier is compared with the one before it; the first one's count is
what was produced. The table tier is also compared with its
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

from broker.client.brokercounts import BrokerCounts

from airflow_provider_logbus.brokertier import behind_reason, broker_gaps
from airflow_provider_logbus.targets.base import BatchRecord, TableFile

HOUR_MS = 3_600_000
PRODUCER, MIRROR, BROKER, TABLE = "producer", "mirror", "broker", "table"
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
                 files: list[TableFile] | None = None, broker: BrokerCounts | None = None) -> dict:
    """The report of `topic` loaded into `table` for [start_ms, end_ms): per hour, each
    tier's count, and missing / duplicated rows per tier. `mirrored` holds a mirror's
    counts per source; `files` the table's data files (`CommitTarget.contents`) — without
    them the table tier is what the batch records claim; `broker` the brokers' counts."""

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
    counted = broker is not None and topic in broker.topics()
    uncounted = broker_gaps(broker, batches, topic) if counted else None
    counted_h = hourly(broker.counts) if counted else {}
    producers = not counted or any(t == topic for t, _ in produced)
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
        rj, held, recorded = rejected_h.get(hour, 0), held_h.get(hour, 0), recorded_h.get(hour, 0)
        partial = counted and uncounted.partial(hour)  # audited as before the broker tier
        tiers = [{"tier": PRODUCER, "count": produced_h.get(hour, 0)}] if producers or partial else []
        if sources:
            by_source = {str(s): mirrored_h[s].get(hour, 0) for s in sources}
            tiers.append({"tier": MIRROR, "count": sum(by_source.values()), "sources": by_source})
        if counted:
            tiers.append({"tier": BROKER, "count": counted_h.get(hour, 0), **({"partial": True} if partial else {})})
        tiers.append({"tier": TABLE, "count": held + rj, "loaded": held, "recorded": recorded, "rejected": rj})
        compared = [t for t in tiers if not t.get("partial")]
        for before, tier in zip(compared, compared[1:]):
            # more committed than reported: records of producers that publish no events
            tier["missing"], tier["unreported" if tier["tier"] == BROKER else "duplicated"] = max(
                before["count"] - tier["count"], 0), max(tier["count"] - before["count"], 0)
        p = max([compared[0]["count"], *(t["count"] for t in compared if t["tier"] == BROKER)])
        missing, duplicated = sum(t.get("missing", 0) for t in tiers), sum(t.get("duplicated", 0) for t in tiers)
        hours.append({
            "hour": utc_minute(hour), "hour_ms": hour, "produced": p,
            "mirrored": next(t["count"] for t in tiers if t["tier"] == MIRROR) if sources else None,
            "counted": counted_h.get(hour, 0) if counted else None, "loaded": held,
            "unreported": sum(t.get("unreported", 0) for t in tiers), "recorded": recorded, "rejected": rj,
            "missing": missing, "duplicated": duplicated, "unrecorded": held - recorded,
            "missing_at": [t["tier"] for t in tiers if t.get("missing")],
            "duplicated_at": [t["tier"] for t in tiers if t.get("duplicated")],
            "completeness": max(p - missing, 0) / p if p else 1.0, "tiers": tiers,
            **({"broker_behind": True} if counted and hour in uncounted.behind_hours else {}),
            **(_unrecorded(hour, files, held_per_batch, recorded_per_batch) if held != recorded else {}),
        })
    total = {k: sum(h[k] for h in hours) for k in TOTALS}
    gaps = offset_gaps(batches, topic)
    return {
        "table": table, "topic": topic, "start": utc_minute(start_ms), "end": utc_minute(end_ms),
        "start_ms": start_ms, "end_ms": end_ms, "threshold": threshold, **total,
        "unrecorded": sum(abs(h["unrecorded"]) for h in hours),  # rows where table and records differ
        "tiers": [*([PRODUCER] if producers else []), *([MIRROR] if sources else []), *([BROKER] if counted else []),
                  TABLE], "sources": [str(s) for s in sources],
        "broker_behind": uncounted.behind if counted else [],
        "broker_reason": behind_reason(uncounted) if counted and uncounted.behind else None,
        "mirrored": sum(h["mirrored"] for h in hours) if sources else None,
        "counted": sum(h["counted"] for h in hours) if counted else None,
        "unreported": sum(h["unreported"] for h in hours),
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
    the threshold, has neither, and its grace has passed. An hour whose batches loaded
    records the brokers have not counted yet (`broker_behind`) is "pending" whatever its
    numbers: they compare the table with counts still to grow."""
    threshold = float(report["threshold"])
    for h in report["hours"]:
        past_grace = now_ms >= h["hour_ms"] + HOUR_MS + grace_ms
        if h.get("broker_behind") and not h["unrecorded"]:
            h["status"], h["reasons"] = "pending", [report["broker_reason"]]
            continue
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
    judged = [h for h in report["hours"] if not h.get("broker_behind")]
    if any(h["duplicated"] for h in judged) or report["overlaps"]:
        reasons.append(f"{sum(h['duplicated'] for h in judged)} duplicated row(s)" + _where(judged, "duplicated") + "".join(
            f"; partition {o['partition']} bytes [{o['start']}, {o['end']}) loaded by both batch {o['after']} "
            f"and batch {o['before']}" for o in report["overlaps"]))
    reasons.extend(_table_reason(h) for h in report["hours"] if h["unrecorded"])
    below = report["completeness"] < threshold
    past_grace = now_ms >= report["end_ms"] + grace_ms
    behind = len(judged) < len(report["hours"])
    if below and past_grace and not behind:
        reasons.append(_below(report, report["hours"], threshold))
    report["status"] = "failed" if reasons else ("pending" if below or behind else "ok")
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
                            files: list[TableFile] | None = None, broker: BrokerCounts | None = None) -> list[dict]:
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
                                    mirrored=mirrored, files=files, broker=broker), now_ms, grace_ms)
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
