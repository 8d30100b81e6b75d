"""LogbusOffsetSnapshotOperator: fixes a run's byte ranges (DESIGN §7)."""

from __future__ import annotations

from typing import Any, Sequence

from airflow.providers.common.compat.sdk import BaseOperator

from airflow_provider_logbus.hooks.logbus import LogbusHook


class LogbusOffsetSnapshotOperator(BaseOperator):
    """Per partition: start = end of the table's last committed batch (the warehouse is
    the source of truth; ZooKeeper offsets of `group` only for a new table, then
    `auto_offset_reset`), end = latest offset now, capped at `max_bytes_per_partition`
    (on a message boundary). Returns (XCom) {"batch_id", "ranges": [...], "committed", ...};
    an already committed batch returns its recorded ranges.

    `on_data_loss`: "fail" (default) when retention deleted unloaded bytes, naming them;
    "skip" starts at the earliest offset and records the lost range for the audit.
    """

    template_fields: Sequence[str] = ("topic", "table", "warehouse", "group", "max_bytes_per_partition",
                                      "on_data_loss")

    def __init__(self, *, topic: str, table: str, warehouse: str, group: str | None = None,
                 auto_offset_reset: str = "earliest", max_bytes_per_partition: int | None = None,
                 on_data_loss: str = "fail", logbus_conn_id: str = LogbusHook.default_conn_name,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.topic, self.table, self.warehouse, self.group = topic, table, warehouse, group
        self.auto_offset_reset, self.max_bytes_per_partition = auto_offset_reset, max_bytes_per_partition
        self.on_data_loss, self.logbus_conn_id = on_data_loss, logbus_conn_id

    def execute(self, context) -> dict:
        hook = LogbusHook(self.logbus_conn_id)
        try:
            cap = int(self.max_bytes_per_partition) if self.max_bytes_per_partition not in (None, "", "None") else None
            return hook.snapshot_ranges(
                warehouse=self.warehouse, table=self.table, topic=self.topic,
                interval_start=context["data_interval_start"], interval_end=context["data_interval_end"],
                group=self.group, auto_offset_reset=self.auto_offset_reset, max_bytes_per_partition=cap,
                on_data_loss=self.on_data_loss)
        finally:
            hook.close()
