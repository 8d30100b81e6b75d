"""LogbusAuditOperator: produced (monitoring events) against loaded (committed batches)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from airflow.providers.common.compat.sdk import AirflowException, BaseOperator

from airflow_provider_logbus.completeness import format_report
from airflow_provider_logbus.hooks.logbus import LogbusHook
from airflow_provider_logbus.warehouse import Warehouse, batch_id_for


class LogbusCompletenessError(AirflowException):
    """Completeness under the threshold after the late-data grace period."""


class LogbusAuditOperator(BaseOperator):
    """Reports produced / loaded / missing / duplicated / completeness per hour of the
    run's data interval, with data losses and offset holes; keeps the report in XCom and
    `<warehouse>/_audit/<table>/<interval>.json` and prints it as a table. Fails when
    completeness < `threshold` once `grace` has passed since the interval end (before
    that it only warns: late data may still come)."""

    template_fields: Sequence[str] = ("warehouse", "table", "topic", "threshold")

    def __init__(self, *, warehouse: str, table: str, topic: str, threshold: float = 0.999,
                 grace: timedelta = timedelta(hours=1), fail_under_threshold: bool = True,
                 monitoring_topic: str = "_logbus_audit", logbus_conn_id: str = LogbusHook.default_conn_name,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.warehouse, self.table, self.topic, self.threshold = warehouse, table, topic, threshold
        self.grace, self.fail_under_threshold = grace, fail_under_threshold
        self.monitoring_topic, self.logbus_conn_id = monitoring_topic, logbus_conn_id

    def execute(self, context) -> dict:
        start, end = context["data_interval_start"], context["data_interval_end"]
        hook = LogbusHook(self.logbus_conn_id)
        try:
            report = hook.audit(warehouse=self.warehouse, table=self.table, topic=self.topic,
                                start_ms=int(start.timestamp() * 1000), end_ms=int(end.timestamp() * 1000),
                                threshold=float(self.threshold), monitoring_topic=self.monitoring_topic)
        finally:
            hook.close()
        past_grace = datetime.now(timezone.utc) >= end + self.grace
        below = report["completeness"] < float(self.threshold)
        report["status"] = "ok" if not below else ("failed" if past_grace else "pending")
        report["run_id"] = context["run_id"]
        path = Warehouse(self.warehouse).write_audit(self.table, batch_id_for(start, end), report)
        self.log.info("audit report (%s) in %s\n%s", report["status"], path, format_report(report))
        if below and past_grace and self.fail_under_threshold:
            raise LogbusCompletenessError(
                f"table {self.table!r} holds {report['completeness']:.4%} of topic {self.topic!r} for "
                f"{report['start']}..{report['end']} ({report['missing']} missing, {report['duplicated']} "
                f"duplicated), under the threshold {float(self.threshold):.4%}; report: {path}")
        if below:
            self.log.warning("completeness %.4f%% under threshold; grace period not over yet", report["completeness"] * 100)
        return report
