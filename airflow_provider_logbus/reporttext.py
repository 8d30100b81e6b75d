"""The audit report as text, for the task log and the demo (`completeness.build_report`
makes the report)."""

from __future__ import annotations

from airflow_provider_logbus.completeness import MIRROR, PRODUCER, TABLE


def format_report(report: dict) -> str:
    """A readable table for the task log and the demo: every tier's count, and the tiers
    where rows went missing or were duplicated."""
    mirror, counted = report.get("mirrored") is not None, report.get("counted") is not None
    lines = [
        f"logbus audit: topic {report['topic']} -> table {report['table']}, {report['start']} .. {report['end']}"
        f" (tiers: {' -> '.join(report.get('tiers', [PRODUCER, TABLE]))})",
        f"{'hour (UTC)':<18} {'produced':>10}" + (f" {'mirrored':>10}" if mirror else "")
        + (f" {'committed':>10}" if counted else "") + f" {'loaded':>10} {'rejected':>9} {'missing':>9} {'duplicated':>10} {'complete':>9}  status",
    ]

    def row(label: str, r: dict, where: str) -> str:
        return (f"{label:<18} {r['produced']:>10}" + (f" {r['mirrored']:>10}" if mirror else "")
                + (f" {r['counted']:>10}" if counted else "") + f" {r['loaded']:>10} {r.get('rejected', 0):>9} {r['missing']:>9} {r['duplicated']:>10} "
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
    if report.get("broker_reason"):
        lines.append(f"pending: {report['broker_reason']}")
    for loss in report["data_loss"]:
        lines.append(f"data loss: partition {loss['partition']} bytes [{loss['lost_start']}, {loss['lost_end']}) "
                     f"deleted by retention before batch {loss['batch_id']}")
    for gap in report["offset_gaps"]:
        lines.append(f"offset {gap['kind']}: partition {gap['partition']} [{gap['start']}, {gap['end']}) "
                     f"between batches {gap['after']} and {gap['before']}")
    lines.extend(f"FAILED: {reason}" for reason in report.get("reasons", []))
    return "\n".join(lines)
