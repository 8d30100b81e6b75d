"""LogbusOffsetSnapshotOperator: fixes a run's byte ranges
(docs/provider.md, "The ranges of a batch")."""

from __future__ import annotations

from typing import Any, Sequence

from airflow.providers.common.compat.sdk import AirflowException, BaseOperator

from airflow_provider_logbus.batch import DataLossError, PlanError, plan_batch
from airflow_provider_logbus.hooks.logbus import LogbusHook
from airflow_provider_logbus.operators.target import DEFAULT_CATALOG_CONN_ID, resolve_target


class LogbusDataLossError(AirflowException):
    """Retention deleted bytes that were never loaded."""


class LogbusOffsetSnapshotOperator(BaseOperator):
    """Per partition: start = the table's committed end (the table is the source of
    truth; ZooKeeper offsets of `group` only for a new table, then `auto_offset_reset`),
    end = latest offset now, capped at `max_bytes_per_partition` (on a message boundary).
    Returns (XCom) {"batch_id", "ranges": [...], "committed", ...}; an already committed
    batch returns its recorded ranges.

    `target`: "directory" (Parquet under `warehouse`) or "iceberg" (catalog connection
    `catalog_conn_id`). `on_data_loss`: "fail" (default) when retention deleted unloaded
    bytes, naming them; "skip" starts at the earliest offset and records the lost range
    for the audit. Overlapping runs may plan the same ranges: the commit decides.
    """

    template_fields: Sequence[str] = ("topic", "table", "warehouse", "group", "max_bytes_per_partition",
                                      "on_data_loss", "target")

    def __init__(self, *, topic: str, table: str, warehouse: str | None = None, group: str | None = None,
                 auto_offset_reset: str = "earliest", max_bytes_per_partition: int | None = None,
                 on_data_loss: str = "fail", target: str = "directory",
                 catalog_conn_id: str = DEFAULT_CATALOG_CONN_ID,
                 logbus_conn_id: str = LogbusHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.topic, self.table, self.warehouse, self.group = topic, table, warehouse, group
        self.auto_offset_reset, self.max_bytes_per_partition = auto_offset_reset, max_bytes_per_partition
        self.on_data_loss, self.logbus_conn_id = on_data_loss, logbus_conn_id
        self.target, self.catalog_conn_id = target, catalog_conn_id

    def execute(self, context) -> dict:
        hook = LogbusHook(self.logbus_conn_id)
        target = resolve_target(self.target, self.table, warehouse=self.warehouse,
                                catalog_conn_id=self.catalog_conn_id)
        try:
            cap = int(self.max_bytes_per_partition) if self.max_bytes_per_partition not in (None, "", "None") else None
            plan = plan_batch(hook.get_conn(), target, self.topic, context["data_interval_start"],
                              context["data_interval_end"], group=self.group,
                              auto_offset_reset=self.auto_offset_reset, max_bytes_per_partition=cap,
                              on_data_loss=self.on_data_loss)
        except DataLossError as exc:
            raise LogbusDataLossError(str(exc)) from None
        except PlanError as exc:
            raise AirflowException(str(exc)) from None
        finally:
            target.close()
            hook.close()
        return {**plan.to_dict(), "warehouse": str(self.warehouse or "")}
