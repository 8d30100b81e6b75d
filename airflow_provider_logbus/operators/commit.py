"""LogbusCommitOperator: publishes a batch atomically, then mirrors offsets to ZooKeeper."""

from __future__ import annotations

from typing import Any, Sequence

from airflow.providers.common.compat.sdk import Asset, BaseOperator

from airflow_provider_logbus.hooks.logbus import LogbusHook


def table_asset(table: str) -> Asset:
    """The Asset a committed batch updates: `logbus-table://<table>`."""
    return Asset(uri=f"logbus-table://{table}", name=f"logbus_table_{table}")


class LogbusCommitOperator(BaseOperator):
    """Renames the load task's staging directory to `batch_id=<id>/` with
    `_logbus_batch.json` (ranges from the snapshot, counts from the job): data and offsets
    in one atomic step. A retry after the rename is a no-op; staging of other attempts
    is removed. Then advances `group`'s ZooKeeper offsets (monitoring mirror) and emits
    the table's Asset."""

    template_fields: Sequence[str] = ("warehouse", "table", "group")

    def __init__(self, *, warehouse: str, table: str, group: str | None = None,
                 snapshot_task_id: str = "snapshot", load_task_id: str = "load",
                 logbus_conn_id: str = LogbusHook.default_conn_name, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", [table_asset(table)])
        super().__init__(**kwargs)
        self.warehouse, self.table, self.group = warehouse, table, group
        self.snapshot_task_id, self.load_task_id, self.logbus_conn_id = snapshot_task_id, load_task_id, logbus_conn_id

    def execute(self, context) -> dict:
        ti = context["ti"]
        plan = ti.xcom_pull(task_ids=self.snapshot_task_id)
        load = ti.xcom_pull(task_ids=self.load_task_id) or {}
        hook = LogbusHook(self.logbus_conn_id)
        try:
            record = hook.commit_batch(warehouse=self.warehouse, table=self.table, plan=plan,
                                       staging=load.get("staging") or "", run_id=context["run_id"], group=self.group)
        finally:
            hook.close()
        self.log.info("batch %s: %d rows, %s", record["batch_id"], record["row_count"],
                      "published" if record["published_now"] else "already published")
        outlet_events = context.get("outlet_events")
        if outlet_events is not None:
            for asset in self.outlets:
                if isinstance(asset, Asset):
                    outlet_events[asset].extra = {"batch_id": record["batch_id"], "rows": record["row_count"]}
        return {k: record[k] for k in ("batch_id", "row_count", "ranges", "published_now")}
