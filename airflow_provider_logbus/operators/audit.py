"""LogbusAuditOperator: every tier's count — produced and mirrored (monitoring events),
held by the table (its metadata) — per hour, and where rows went missing or doubled."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from airflow.providers.common.compat.sdk import AirflowException, Asset, BaseOperator

from broker.client.monitoring import MONITORING_TOPIC

from airflow_provider_logbus.batch import audit_inputs, await_broker_counts
from airflow_provider_logbus.completeness import (announce_complete_hours, judge, note_withdrawn,
                                                  utc_minute, withdraw_hours)
from airflow_provider_logbus.hooks.logbus import LogbusHook
from airflow_provider_logbus.operators.target import DEFAULT_CATALOG_CONN_ID, resolve_target
from airflow_provider_logbus.plan import batch_id_for
from airflow_provider_logbus.reporttext import format_report


class LogbusCompletenessError(AirflowException):
    """Completeness under the threshold after the late-data grace period, or duplicates."""


def complete_hours_asset(table: str) -> Asset:
    """The Asset announcing that an hour of `table` is complete: one event per hour,
    with the hour as its partition key (`logbus-complete://<table>`)."""
    return Asset(uri=f"logbus-complete://{table}", name=f"logbus_complete_{table}")


class LogbusAuditOperator(BaseOperator):
    """Reports per hour of the run's data interval what each tier counted — produced,
    mirrored (per source, when a mirror reports on the topic), committed (the brokers'
    counts; waiting up to `broker_wait` for them to cover what the table loaded), loaded
    (the rows the table holds, from its metadata) and rejected — with missing / duplicated rows and the tier
    where they went, completeness, data losses and offset holes or overlaps; keeps the
    report in XCom and beside the table (`<warehouse>/_audit/<table>/<interval>.json` for
    the directory target) and prints it as a table.

    Fails at once on any duplicate (duplicated rows at any tier or overlapping batch
    ranges: they never heal) and on a table whose rows differ from its batch records
    (naming the files no logbus batch published), and when completeness < `threshold`
    once `grace` has passed since the interval end (before that it only warns: late data
    may still come).

    Every hour found complete (at or above the threshold, no duplicate, past its grace),
    contiguous from the table's `logbus.complete-through` watermark up to the interval's
    end, is announced once: an event of `complete_hours_asset(table)` with the hour as
    partition key (extra: hour, rows, rejected, completeness, tiers), and the watermark advances
    past it (a compare-and-swap: two audits never announce the same hour).

    Announced hours are judged again, from `recheck` before the watermark (and the
    interval's own): one found duplicated, unrecorded or incomplete now — rows added to
    or taken from the table since — is withdrawn. The watermark falls back to it, the
    report lists it (`withdrawn_hours`) and the audit fails naming it (an incomplete one
    only with `fail_under_threshold`); once it is complete the watermark moves on again,
    with a second Asset event for the withdrawn hours only.
    """

    # every setting that decides the report: the Airflow page (`ui/`) reads them from the
    # serialized DAG to compute the same numbers
    template_fields: Sequence[str] = ("warehouse", "table", "topic", "threshold", "target", "grace",
                                      "monitoring_topic", "catalog_conn_id", "logbus_conn_id")

    def __init__(self, *, table: str, topic: str, warehouse: str | None = None, threshold: float = 0.999,
                 grace: timedelta = timedelta(hours=1), fail_under_threshold: bool = True,
                 monitoring_topic: str = MONITORING_TOPIC, target: str = "directory",
                 catalog_conn_id: str = DEFAULT_CATALOG_CONN_ID,
                 logbus_conn_id: str = LogbusHook.default_conn_name, recheck: timedelta = timedelta(days=1),
                 broker_wait: timedelta = timedelta(minutes=1), **kwargs: Any) -> None:
        kwargs.setdefault("outlets", [complete_hours_asset(table)])
        super().__init__(**kwargs)
        self.warehouse, self.table, self.topic, self.threshold = warehouse, table, topic, threshold
        self.grace, self.fail_under_threshold, self.recheck = grace, fail_under_threshold, recheck
        self.monitoring_topic, self.logbus_conn_id = monitoring_topic, logbus_conn_id
        self.target, self.catalog_conn_id, self.broker_wait = target, catalog_conn_id, broker_wait

    def execute(self, context) -> dict:
        start, end = context["data_interval_start"], context["data_interval_end"]
        start_ms, end_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
        # first, before any connection: a manual run's interval ends at its logical date
        # (Airflow 3), so `dags test <day>` audits the day before — the log says which
        self.log.info("auditing table %r against topic %r for %s .. %s (the run's data interval)", self.table,
                      self.topic, utc_minute(start_ms), utc_minute(end_ms))
        threshold, grace_ms = float(self.threshold), int(self.grace.total_seconds() * 1000)
        hook = LogbusHook(self.logbus_conn_id)
        target = resolve_target(self.target, self.table, warehouse=self.warehouse,
                                catalog_conn_id=self.catalog_conn_id)
        try:
            # read before the inputs: an hour announced by then is judged again on inputs
            # that hold at least what the audit that announced it saw (never a stale view)
            watermark = target.complete_through()
            recheck_from = None if watermark is None else min(start_ms, watermark - int(
                self.recheck.total_seconds() * 1000))
            inputs = audit_inputs(hook.get_conn(), target, self.monitoring_topic, since_ms=recheck_from)
            inputs = await_broker_counts(hook.get_conn(), inputs, self.topic, self.broker_wait.total_seconds())
            now_ms = int(datetime.now(timezone.utc).timestamp() * 1000)
            report = judge(inputs.report(self.table, self.topic, start_ms, end_ms, threshold), now_ms, grace_ms)
            report["run_id"] = context["run_id"]
            withdrawn = []
            if watermark is not None:  # the hours announced complete, judged again
                announced = judge(inputs.report(self.table, self.topic, recheck_from, watermark, threshold), now_ms,
                                  grace_ms)
                withdrawn = withdraw_hours(target, announced, context["run_id"])
            note_withdrawn(report, withdrawn, watermark)
            path = target.write_audit(batch_id_for(start, end), report)
            self.log.info("audit report (%s) in %s\n%s", report["status"], path, format_report(report))
            never_heals = report["duplicated"] or report["overlaps"] or report["unrecorded"] or any(
                h["status"] != "incomplete" for h in report["withdrawn_hours"])
            if report["status"] == "failed" and (never_heals or self.fail_under_threshold):
                raise LogbusCompletenessError(
                    f"audit of table {self.table!r} against topic {self.topic!r} for {report['start']}.."
                    f"{report['end']} failed: {'; '.join(report['reasons'])}; report: {path}")
            if report["status"] != "ok":
                self.log.warning("completeness %.4f%% (%s)", report["completeness"] * 100, report["status"])
            # the last step: an announcement is claimed only by an audit that succeeds
            hours = announce_complete_hours(target, self.topic, inputs.produced, inputs.batches, threshold, now_ms,
                                            grace_ms, end_ms, context["run_id"], mirrored=inputs.mirrored,
                                            files=inputs.files, broker=inputs.broker)
            report["announced_hours"] = [h["hour"] for h in hours]
            target.write_audit(batch_id_for(start, end), report)
        finally:
            target.close()
            hook.close()
        self._emit(context, hours)
        return report

    def _emit(self, context, hours: list[dict]) -> None:
        """One event of the complete-hours Asset per announced hour (its partition key)."""
        if not hours:
            return
        self.log.info("announcing complete hour(s) %s", ", ".join(h["hour"] for h in hours))
        outlet_events = context.get("outlet_events")
        if outlet_events is None:
            return
        for asset in self.outlets:
            if isinstance(asset, Asset) and asset.uri.startswith("logbus-complete://"):
                accessor = outlet_events[asset]
                accessor.extra = {"table": self.table, "topic": self.topic, "hours": {
                    h["hour"]: {"hour": h["hour"], "rows": h["loaded"], "rejected": h["rejected"],
                                "completeness": h["completeness"], "tiers": h["tiers"]} for h in hours}}
                if hasattr(accessor, "add_partitions"):  # Airflow >= 3.2: one event per hour
                    accessor.add_partitions([h["hour"] for h in hours])
