"""Daily completeness audit of a table loaded by `logbus_hourly_load`: produced
(producer monitoring events) against loaded (committed batches), per hour of the day.
Fails when completeness is under the threshold once the late-data grace has passed.

Configuration (environment): LOGBUS_TOPIC, LOGBUS_TABLE, LOGBUS_WAREHOUSE, LOGBUS_CONN_ID,
LOGBUS_AUDIT_THRESHOLD (0.999), LOGBUS_DAILY_AUDIT_GRACE_MINUTES (120).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG
from airflow.sdk.definitions.timetables.interval import CronDataIntervalTimetable

from airflow_provider_logbus.operators.audit import LogbusAuditOperator

with DAG(
    dag_id="logbus_daily_audit",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["logbus", "example", "audit"],
) as dag:
    LogbusAuditOperator(
        task_id="audit",
        warehouse=os.environ.get("LOGBUS_WAREHOUSE", "/tmp/logbus-warehouse"),
        table=os.environ.get("LOGBUS_TABLE", "web_activity"),
        topic=os.environ.get("LOGBUS_TOPIC", "web_activity"),
        threshold=float(os.environ.get("LOGBUS_AUDIT_THRESHOLD", "0.999")),
        grace=timedelta(minutes=float(os.environ.get("LOGBUS_DAILY_AUDIT_GRACE_MINUTES", "120"))),
        logbus_conn_id=os.environ.get("LOGBUS_CONN_ID", "logbus_default"),
    )
