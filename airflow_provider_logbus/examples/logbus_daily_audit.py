"""Daily completeness audit of the table `logbus_hourly_load` writes: produced (producer
monitoring events) against loaded (committed batches), per hour of the day. Fails when
completeness is under the threshold once the late-data grace has passed.

Configuration: `airflow_provider_logbus.examples.config`, the same settings the hourly
load reads (topic, table, target, catalog, warehouse), so this audits that table on
whichever target it is; LOGBUS_AUDIT_THRESHOLD (0.999) and
LOGBUS_DAILY_AUDIT_GRACE_MINUTES (120) are its own.

By hand: a manual run's data interval ends at its logical date (Airflow 3), so
`airflow dags test logbus_daily_audit 2026-11-26` audits 2026-11-25; the task's first
log line names the interval it audits.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG
from airflow.sdk.definitions.timetables.interval import CronDataIntervalTimetable

from airflow_provider_logbus.examples.config import example_config
from airflow_provider_logbus.operators.audit import LogbusAuditOperator

config = example_config()

with DAG(
    dag_id="logbus_daily_audit",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["logbus", "example", "audit"],
) as dag:
    LogbusAuditOperator(
        task_id="audit", topic=config.topic, threshold=config.audit_threshold,
        grace=timedelta(minutes=config.daily_audit_grace_minutes), logbus_conn_id=config.logbus_conn_id,
        **config.table_args(),
    )
