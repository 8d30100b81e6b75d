"""Downstream of the hourly load: runs once for every hour the audit found complete.

`LogbusAuditOperator` announces each complete hour of a table once, as an event of the
Asset `logbus-complete://<table>` whose partition key is the hour (`2024-01-01T10:00Z`),
and advances the table's `logbus.complete-through` watermark. Scheduled with a
`PartitionedAssetTimetable`, this DAG gets one run per announced hour, with the hour as
its `partition_key` — the place for a job that must only see complete hours (an
aggregate, an export, a model refresh).

Configuration: `airflow_provider_logbus.examples.config`, the settings the hourly load
and its audit read (table, target, catalog, warehouse), so this reads the table they
write and announce.
"""

from __future__ import annotations

from airflow.sdk import DAG, PartitionedAssetTimetable, task

from airflow_provider_logbus.examples.config import example_config
from airflow_provider_logbus.operators.audit import complete_hours_asset

config = example_config()

with DAG(
    dag_id="logbus_complete_hours",
    schedule=PartitionedAssetTimetable(assets=complete_hours_asset(config.table)),
    tags=["logbus", "example"],
) as dag:

    @task
    def process_complete_hour(dag_run=None, triggering_asset_events=None) -> dict:
        """Count the hour's rows in the table: the hour is complete, so the count is final."""
        from datetime import datetime, timezone

        from airflow_provider_logbus.operators.target import resolve_target

        hour = dag_run.partition_key
        details = {}
        for events in (triggering_asset_events or {}).values():
            for event in events:
                details = (event.extra or {}).get("hours", {}).get(hour, details)
        start = datetime.strptime(hour, "%Y-%m-%dT%H:%MZ").replace(tzinfo=timezone.utc)
        target = resolve_target(config.target, config.table, warehouse=config.warehouse,
                                catalog_conn_id=config.catalog_conn_id)
        try:
            hour_ms = int(start.timestamp() * 1000) // 3_600_000 * 3_600_000
            rows = sum(c["count"] for b in target.batches() for c in b.counts
                       if hour_ms <= int(c["window_start"]) < hour_ms + 3_600_000)
        finally:
            target.close()
        print(f"hour {hour} of {config.table} is complete: {rows} rows (audit: {details})")
        return {"hour": hour, "rows": rows, "audit": details}

    process_complete_hour()
