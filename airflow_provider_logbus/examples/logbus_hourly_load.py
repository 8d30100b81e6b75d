"""Hourly load of a logbus topic into a table, exactly once, with an audit.

    sensor ─► [check_schema ─►] snapshot ─► load (Spark) ─► commit ─► audit

Configuration: `airflow_provider_logbus.examples.config` (environment variables, read
when the DAG is parsed, shared with `logbus_daily_audit` and `logbus_complete_hours` so
the three always name the same topic, table, target, catalog and schema). By default an
Iceberg table `logbus.web_activity` of the simulator's events on an embedded SQLite
catalog under /tmp/logbus-warehouse; `LOGBUS_TARGET=directory` writes Parquet
directories instead. Per run, `params` override on_data_loss and max_bytes_per_partition.

Registry-framed values (docs/schemas.md): `LOGBUS_VALUE_FORMAT=confluent` decodes
Confluent-framed Avro and JSON Schema values with the registry of LOGBUS_REGISTRY_URL or
LOGBUS_REGISTRY_CONN_ID; `LOGBUS_SCHEMA_SUBJECT` makes the subject's latest version the
table's schema (a field a new version adds becomes a column at the next load), and adds
`check_schema`, which fails the run before the snapshot and Spark when that version is
one the table cannot take.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param
from airflow.sdk.definitions.timetables.interval import CronDataIntervalTimetable

from airflow_provider_logbus.examples.config import example_config
from airflow_provider_logbus.operators.audit import LogbusAuditOperator
from airflow_provider_logbus.operators.commit import LogbusCommitOperator
from airflow_provider_logbus.operators.schema_check import LogbusSchemaCheckOperator
from airflow_provider_logbus.operators.snapshot import LogbusOffsetSnapshotOperator
from airflow_provider_logbus.operators.spark_load import LogbusSparkLoadOperator
from airflow_provider_logbus.sensors.lag import LogbusLagSensor

config = example_config()

with DAG(
    dag_id="logbus_hourly_load",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    params={
        "on_data_loss": Param(config.on_data_loss, enum=["fail", "skip"]),
        "max_bytes_per_partition": Param(config.max_bytes_per_partition, type=["null", "string", "integer"]),
    },
    default_args={"retries": 2, "retry_delay": timedelta(seconds=config.retry_delay_seconds)},
    tags=["logbus", "example"],
) as dag:
    wait = LogbusLagSensor(
        task_id="wait_for_data", topic=config.topic, group=config.group, wait_for_interval_end=True,
        grace=timedelta(minutes=config.sensor_grace_minutes), deferrable=config.deferrable,
        poke_interval=5, timeout=3 * 3600, mode="poke", logbus_conn_id=config.logbus_conn_id,
    )
    snapshot = LogbusOffsetSnapshotOperator(
        task_id="snapshot", topic=config.topic, group=config.group,
        on_data_loss="{{ params.on_data_loss }}", max_bytes_per_partition="{{ params.max_bytes_per_partition }}",
        logbus_conn_id=config.logbus_conn_id, **config.table_args(),
    )
    load = LogbusSparkLoadOperator(
        task_id="load", snapshot_task_id="snapshot", value_format=config.value_format, schema=config.value_schema,
        schema_subject=config.schema_subject, **config.registry_args(),
        max_reject_rate=config.max_reject_rate, leader_wait=config.leader_wait_seconds,
        logbus_conn_id=config.logbus_conn_id, conf={"spark.driver.memory": "2g", "spark.sql.shuffle.partitions": "4"},
        **config.table_args(),
    )
    commit = LogbusCommitOperator(
        task_id="commit", group=config.group, snapshot_task_id="snapshot", load_task_id="load",
        logbus_conn_id=config.logbus_conn_id, **config.table_args(),
    )
    audit = LogbusAuditOperator(
        task_id="audit", topic=config.topic, threshold=config.audit_threshold,
        grace=timedelta(minutes=config.audit_grace_minutes), logbus_conn_id=config.logbus_conn_id, retries=0,
        **config.table_args(),
    )
    if config.schema_subject:
        check = LogbusSchemaCheckOperator(
            task_id="check_schema", schema_subject=config.schema_subject, **config.registry_args(),
            **config.table_args(),
        )
        wait >> check >> snapshot
    else:
        wait >> snapshot
    snapshot >> load >> commit >> audit
