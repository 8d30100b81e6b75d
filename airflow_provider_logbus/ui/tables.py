"""Which tables the page shows: one per `LogbusAuditOperator` task in the DAGs the
user may read, configured as that task is (its template fields, from the serialized
DAG in Airflow's database — nothing to configure twice, and a DAG's access rules are
the table's).
"""

from __future__ import annotations

import re
from datetime import timedelta

from broker.client.monitoring import MONITORING_TOPIC

from airflow_provider_logbus.hooks.iceberg import DEFAULT_CONN_ID as DEFAULT_CATALOG_CONN_ID
from airflow_provider_logbus.hooks.logbus import LogbusHook
from airflow_provider_logbus.ui.status import AuditedTable

AUDIT_OPERATOR = ("airflow_provider_logbus.operators.audit", "LogbusAuditOperator")
DEFAULT_GRACE = timedelta(hours=1)
_TIMEDELTA = re.compile(r"^(?:(-?\d+) days?, )?(\d+):(\d\d):(\d\d(?:\.\d+)?)$")


def audited_tables(dag_ids: set[str]) -> list[AuditedTable]:
    """The audit tasks of the latest serialized version of each DAG in `dag_ids`.
    A task whose settings are templates (rendered only when it runs) is left out."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = SerializedDagModel.get_latest_serialized_dags(dag_ids=sorted(dag_ids), session=session)
        found = [t for row in rows for t in tables_of(row.dag_id, row.data or {})]
    return sorted(found, key=lambda t: (t.table, t.key))


def tables_of(dag_id: str, serialized: dict) -> list[AuditedTable]:
    """The audit tasks in one serialized DAG (`SerializedDagModel.data`)."""
    tables = []
    for task in serialized.get("dag", {}).get("tasks", []):
        fields = task.get("__var", task)
        if (fields.get("_task_module"), fields.get("task_type")) != AUDIT_OPERATOR:
            continue
        values = [fields.get(k) for k in ("table", "topic", "target", "warehouse")]
        if any(isinstance(v, str) and "{{" in v for v in values):
            continue
        tables.append(AuditedTable(
            dag_id=dag_id, task_id=fields["task_id"], table=fields["table"], topic=fields["topic"],
            target=fields.get("target") or "directory", warehouse=fields.get("warehouse"),
            catalog_conn_id=fields.get("catalog_conn_id") or DEFAULT_CATALOG_CONN_ID,
            logbus_conn_id=fields.get("logbus_conn_id") or LogbusHook.default_conn_name,
            threshold=float(fields.get("threshold") or 0.999),
            grace_ms=int(parse_timedelta(fields.get("grace")).total_seconds() * 1000),
            monitoring_topic=fields.get("monitoring_topic") or MONITORING_TOPIC,
        ))
    return tables


def parse_timedelta(value: object) -> timedelta:
    """A serialized timedelta: seconds, `str(timedelta)` ("1:00:00", "2 days, 0:30:00"),
    or Airflow's {"__type": "timedelta", "__var": seconds}; the operator's default else."""
    if isinstance(value, dict) and "__var" in value:
        value = value["__var"]
    if isinstance(value, (int, float)):
        return timedelta(seconds=value)
    match = _TIMEDELTA.match(value) if isinstance(value, str) else None
    if not match:
        return DEFAULT_GRACE
    days, hours, minutes, seconds = match.groups()
    return timedelta(days=int(days or 0), hours=int(hours), minutes=int(minutes), seconds=float(seconds))
