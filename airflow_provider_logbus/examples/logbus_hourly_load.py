"""Hourly load of a logbus topic into a table, exactly once, with an audit.

    sensor ─► snapshot ─► load (Spark) ─► commit ─► audit

Configuration (environment, read when the DAG is parsed):
  LOGBUS_TOPIC (web_activity), LOGBUS_TABLE (web_activity), LOGBUS_WAREHOUSE
  (/tmp/logbus-warehouse), LOGBUS_GROUP (warehouse_loader), LOGBUS_CONN_ID (logbus_default),
  LOGBUS_SENSOR_GRACE_MINUTES (5), LOGBUS_DEFERRABLE (false), LOGBUS_ON_DATA_LOSS (fail),
  LOGBUS_MAX_BYTES_PER_PARTITION (no cap), LOGBUS_AUDIT_THRESHOLD (0.999),
  LOGBUS_AUDIT_GRACE_MINUTES (60), LOGBUS_RETRY_DELAY_SECONDS (60), LOGBUS_VALUE_SCHEMA
  (Spark DDL of the JSON values, or a .json schema file; inferred from a sample when unset,
  required for Iceberg), LOGBUS_TARGET ("directory": Parquet directories under the
  warehouse; "iceberg": an Iceberg table), LOGBUS_CATALOG_CONN_ID (logbus_iceberg_default;
  without that connection, an embedded SQLite catalog under the warehouse),
  LOGBUS_MAX_REJECT_RATE (1.0: values that do not parse go to the rejects and never fail
  the load; e.g. 0.01 fails it above 1%).
Per run, `params` override on_data_loss and max_bytes_per_partition.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param
from airflow.sdk.definitions.timetables.interval import CronDataIntervalTimetable

from airflow_provider_logbus.operators.audit import LogbusAuditOperator
from airflow_provider_logbus.operators.commit import LogbusCommitOperator
from airflow_provider_logbus.operators.snapshot import LogbusOffsetSnapshotOperator
from airflow_provider_logbus.operators.spark_load import LogbusSparkLoadOperator
from airflow_provider_logbus.sensors.lag import LogbusLagSensor

TOPIC = os.environ.get("LOGBUS_TOPIC", "web_activity")
TABLE = os.environ.get("LOGBUS_TABLE", "web_activity")
WAREHOUSE = os.environ.get("LOGBUS_WAREHOUSE", "/tmp/logbus-warehouse")
GROUP = os.environ.get("LOGBUS_GROUP", "warehouse_loader")
CONN_ID = os.environ.get("LOGBUS_CONN_ID", "logbus_default")
TARGET = {"target": os.environ.get("LOGBUS_TARGET", "directory"),
          "catalog_conn_id": os.environ.get("LOGBUS_CATALOG_CONN_ID", "logbus_iceberg_default")}

with DAG(
    dag_id="logbus_hourly_load",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    params={
        "on_data_loss": Param(os.environ.get("LOGBUS_ON_DATA_LOSS", "fail"), enum=["fail", "skip"]),
        "max_bytes_per_partition": Param(os.environ.get("LOGBUS_MAX_BYTES_PER_PARTITION") or None,
                                         type=["null", "string", "integer"]),
    },
    default_args={
        "retries": 2,
        "retry_delay": timedelta(seconds=int(os.environ.get("LOGBUS_RETRY_DELAY_SECONDS", "60"))),
    },
    tags=["logbus", "example"],
) as dag:
    wait = LogbusLagSensor(
        task_id="wait_for_data", topic=TOPIC, group=GROUP, wait_for_interval_end=True,
        grace=timedelta(minutes=float(os.environ.get("LOGBUS_SENSOR_GRACE_MINUTES", "5"))),
        deferrable=os.environ.get("LOGBUS_DEFERRABLE", "false").lower() == "true",
        poke_interval=5, timeout=3 * 3600, mode="poke", logbus_conn_id=CONN_ID,
    )
    snapshot = LogbusOffsetSnapshotOperator(
        task_id="snapshot", topic=TOPIC, table=TABLE, warehouse=WAREHOUSE, group=GROUP,
        on_data_loss="{{ params.on_data_loss }}", max_bytes_per_partition="{{ params.max_bytes_per_partition }}",
        logbus_conn_id=CONN_ID, **TARGET,
    )
    load = LogbusSparkLoadOperator(
        task_id="load", warehouse=WAREHOUSE, table=TABLE, snapshot_task_id="snapshot", value_format="json",
        schema=os.environ.get("LOGBUS_VALUE_SCHEMA") or None,
        max_reject_rate=float(os.environ.get("LOGBUS_MAX_REJECT_RATE", "1.0")),
        logbus_conn_id=CONN_ID, conf={"spark.driver.memory": "2g", "spark.sql.shuffle.partitions": "4"}, **TARGET,
    )
    commit = LogbusCommitOperator(
        task_id="commit", warehouse=WAREHOUSE, table=TABLE, group=GROUP, snapshot_task_id="snapshot",
        load_task_id="load", logbus_conn_id=CONN_ID, **TARGET,
    )
    audit = LogbusAuditOperator(
        task_id="audit", warehouse=WAREHOUSE, table=TABLE, topic=TOPIC,
        threshold=float(os.environ.get("LOGBUS_AUDIT_THRESHOLD", "0.999")),
        grace=timedelta(minutes=float(os.environ.get("LOGBUS_AUDIT_GRACE_MINUTES", "60"))),
        logbus_conn_id=CONN_ID, retries=0, **TARGET,
    )
    wait >> snapshot >> load >> commit >> audit
