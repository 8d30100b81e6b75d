"""LogbusCommitOperator: publishes a batch atomically with its offsets, then mirrors
the offsets to ZooKeeper."""

from __future__ import annotations

from typing import Any, Sequence

from airflow.providers.common.compat.sdk import Asset, BaseOperator

from airflow_provider_logbus.batch import commit_batch
from airflow_provider_logbus.hooks.logbus import LogbusHook
from airflow_provider_logbus.operators.target import DEFAULT_CATALOG_CONN_ID, resolve_target
from airflow_provider_logbus.operators.lineage import ReportsBatchLineage
from airflow_provider_logbus.plan import BatchPlan


def table_asset(table: str) -> Asset:
    """The Asset a committed batch updates: `logbus-table://<table>`."""
    return Asset(uri=f"logbus-table://{table}", name=f"logbus_table_{table}")


class LogbusCommitOperator(ReportsBatchLineage, BaseOperator):
    """Publishes the load task's staged batch with the ranges from the snapshot — data
    and offsets in one atomic step, and only if the batch starts where the table's
    committed offsets end (a compare-and-swap). A batch whose ranges another run
    committed first is re-planned onto the rows past the new end, so overlapping runs
    (backfills, manual triggers) never load a message twice and still succeed. A retry
    after the publish is a no-op; staging of other attempts is removed. Then advances
    `group`'s ZooKeeper offsets (monitoring mirror) and emits the table's Asset."""

    template_fields: Sequence[str] = ("warehouse", "table", "group", "target")

    def __init__(self, *, table: str, warehouse: str | None = None, group: str | None = None,
                 snapshot_task_id: str = "snapshot", load_task_id: str = "load", target: str = "directory",
                 catalog_conn_id: str = DEFAULT_CATALOG_CONN_ID,
                 logbus_conn_id: str = LogbusHook.default_conn_name, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", [table_asset(table)])
        super().__init__(**kwargs)
        self.warehouse, self.table, self.group = warehouse, table, group
        self.snapshot_task_id, self.load_task_id, self.logbus_conn_id = snapshot_task_id, load_task_id, logbus_conn_id
        self.target, self.catalog_conn_id = target, catalog_conn_id

    def execute(self, context) -> dict:
        ti = context["ti"]
        plan = BatchPlan.from_dict(ti.xcom_pull(task_ids=self.snapshot_task_id))
        load = ti.xcom_pull(task_ids=self.load_task_id) or {}
        hook = LogbusHook(self.logbus_conn_id)
        target = resolve_target(self.target, self.table, warehouse=self.warehouse,
                                catalog_conn_id=self.catalog_conn_id)
        try:
            result = commit_batch(target, plan, load.get("staging"), context["run_id"],
                                  cluster=hook.get_conn() if self.group else None, group=self.group)
            self.batch_lineage = {"address": hook.cluster_address(), "table": target.dataset(),
                                  "batch_id": plan.batch_id, "ranges": result.record.ranges, "published": True,
                                  "row_count": result.record.row_count}
        finally:
            target.close()
            hook.close()
        record = result.record
        self.log.info("batch %s: %d rows, %d rejected, %s%s", record.batch_id, record.row_count,
                      record.rejected_count, "published" if result.published_now else "already published",
                      " after re-planning onto the table's committed end" if result.replanned else "")
        outlet_events = context.get("outlet_events")
        if outlet_events is not None:
            for asset in self.outlets:
                if isinstance(asset, Asset):
                    outlet_events[asset].extra = {"batch_id": record.batch_id, "rows": record.row_count}
        d = record.to_dict()
        return {**{k: d[k] for k in ("batch_id", "row_count", "rejected_count", "ranges", "planned_ranges")},
                "published_now": result.published_now}
