"""Which tables the page shows: one per `LogbusAuditOperator` task in the DAGs the
user may read, configured as that task is (its template fields, from the serialized
DAG in Airflow's database — nothing to configure twice, and a DAG's access rules are
the table's).
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

from broker.client.monitoring import MONITORING_TOPIC

from airflow_provider_logbus.hooks.iceberg import DEFAULT_CONN_ID as DEFAULT_CATALOG_CONN_ID
from airflow_provider_logbus.hooks.logbus import LogbusHook
from airflow_provider_logbus.ui.status import AuditedTable, PageTable

AUDIT_OPERATOR = ("airflow_provider_logbus.operators.audit", "LogbusAuditOperator")
COMMIT_OPERATOR = ("airflow_provider_logbus.operators.commit", "LogbusCommitOperator")
DEFAULT_GRACE = timedelta(hours=1)
_TIMEDELTA = re.compile(r"^(?:(-?\d+) days?, )?(\d+):(\d\d):(\d\d(?:\.\d+)?)$")


def audited_tables(dag_ids: set[str]) -> list[AuditedTable]:
    """The audit tasks of the latest serialized version of each DAG in `dag_ids`.
    A task whose settings are templates (rendered only when it runs) is left out."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = SerializedDagModel.get_latest_serialized_dags(dag_ids=sorted(dag_ids), session=session)
        dags = {row.dag_id: row.data or {} for row in rows}
    return with_loading_dags([t for dag_id, data in dags.items() for t in tables_of(dag_id, data)], dags)


def with_loading_dags(tables: list[AuditedTable], dags: dict[str, dict]) -> list[AuditedTable]:
    """Each table with the DAG that commits its batches (a daily audit DAG checks what an
    hourly DAG loaded: the batches' run ids are that DAG's runs); its own DAG when no
    other commits it."""
    committing: dict[tuple, list[str]] = {}
    for dag_id, data in dags.items():
        for fields in _tasks(data, COMMIT_OPERATOR):
            key = (fields.get("table"), fields.get("target") or "directory", fields.get("warehouse"))
            committing.setdefault(key, []).append(dag_id)
    out = []
    for table in tables:
        loaders = committing.get((table.table, table.target, table.warehouse), [])
        load_dag = table.dag_id if table.dag_id in loaders or not loaders else sorted(loaders)[0]
        out.append(replace(table, load_dag_id=load_dag))
    return sorted(out, key=lambda t: (t.table, t.key))


def page_tables(audits: list[AuditedTable]) -> list[PageTable]:
    """One entry per table: the audits of one table (its target, warehouse and catalog)
    that count it against the same topic and monitoring events, the loading DAG's own
    audit first; audits that differ in those are entries of their own."""
    groups: dict[tuple, list[AuditedTable]] = {}
    for audit in audits:
        groups.setdefault((audit.table, audit.target, audit.warehouse, audit.catalog_conn_id, audit.topic,
                           audit.logbus_conn_id, audit.monitoring_topic), []).append(audit)
    return [PageTable(tuple(sorted(group, key=lambda a: (a.dag_id != a.load_dag_id, a.key))))
            for _, group in sorted(groups.items(), key=lambda kv: tuple(str(v) for v in kv[0]))]


def _tasks(serialized: dict, operator: tuple[str, str]) -> list[dict]:
    tasks = (task.get("__var", task) for task in serialized.get("dag", {}).get("tasks", []))
    return [fields for fields in tasks if (fields.get("_task_module"), fields.get("task_type")) == operator]


def tables_of(dag_id: str, serialized: dict) -> list[AuditedTable]:
    """The audit tasks in one serialized DAG (`SerializedDagModel.data`)."""
    tables = []
    for fields in _tasks(serialized, AUDIT_OPERATOR):
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
            monitoring_topic=fields.get("monitoring_topic") or MONITORING_TOPIC, load_dag_id=dag_id,
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
