"""Daily maintenance of the table `logbus_hourly_load` writes (Iceberg only): compacts
the hours the audit announced complete, expires snapshots older than a week (the batch
records stay in `<table>_batches`), removes orphan files older than three days. Runs
beside the hourly loads and audits without blocking them.

Configuration: `airflow_provider_logbus.examples.config` (the same table and catalog as
the hourly load). With LOGBUS_TARGET=directory there is nothing to maintain and no DAG.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG
from airflow.sdk.definitions.timetables.interval import CronDataIntervalTimetable

from airflow_provider_logbus.examples.config import example_config
from airflow_provider_logbus.operators.maintenance import LogbusTableMaintenanceOperator

config = example_config()

if config.target == "iceberg":
    with DAG(
        dag_id="logbus_table_maintenance",
        schedule=CronDataIntervalTimetable("30 3 * * *", timezone="UTC"),
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=1,
        tags=["logbus", "example", "maintenance"],
    ) as dag:
        LogbusTableMaintenanceOperator(task_id="maintain", retries=2, **config.table_args())
