"""LogbusTableMaintenanceOperator: keeps a logbus Iceberg table healthy for a year of
hourly loads — closed hours compacted, old snapshots expired without losing a batch
record, orphan files removed (`targets/iceberg_maintenance.py`; docs/provider.md, "Table
maintenance")."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from airflow.providers.common.compat.sdk import AirflowException, BaseOperator

from airflow_provider_logbus.operators.target import DEFAULT_CATALOG_CONN_ID, resolve_target
from airflow_provider_logbus.targets.iceberg_compaction import TARGET_FILE_BYTES


class LogbusTableMaintenanceOperator(BaseOperator):
    """One maintenance run of `table` (an Iceberg table of the provider's targets):

    - **compaction** of every hour that is closed — before the table's complete-through
      watermark (hours the audit announced complete) and older than `settle` — and has
      more files than ceil(bytes / `target_file_bytes`); `audited_only=False` compacts
      hours older than `settle` without waiting for an audit;
    - **snapshot expiry** of snapshots older than `expire_after` (the current one stays),
      after every batch record is in the `<table>_batches` ledger;
    - **orphan removal** of files under the table's data directory that no snapshot
      references and that are older than `orphan_after` (killed attempts, files a
      compaction replaced once their snapshots expired).

    Safe beside running loads and audits, to retry, and to run twice at once. Returns
    what it did (XCom)."""

    template_fields: Sequence[str] = ("table", "warehouse", "catalog_conn_id", "target")

    def __init__(self, *, table: str, warehouse: str | None = None, target: str = "iceberg",
                 catalog_conn_id: str = DEFAULT_CATALOG_CONN_ID, target_file_bytes: int = TARGET_FILE_BYTES,
                 audited_only: bool = True, settle: timedelta = timedelta(hours=2),
                 expire_after: timedelta | None = timedelta(days=7),
                 orphan_after: timedelta | None = timedelta(days=3), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if target_file_bytes < 1 << 20:
            raise ValueError(f"target_file_bytes={target_file_bytes}: use at least 1 MiB (default 128 MiB)")
        if orphan_after is not None and orphan_after < timedelta(hours=1):
            raise ValueError(f"orphan_after={orphan_after}: under an hour, a load still writing its files could "
                             "lose them; use a margin longer than any load attempt (default 3 days)")
        self.table, self.warehouse, self.target, self.catalog_conn_id = table, warehouse, target, catalog_conn_id
        self.target_file_bytes, self.audited_only, self.settle = target_file_bytes, audited_only, settle
        self.expire_after, self.orphan_after = expire_after, orphan_after

    def execute(self, context) -> dict:
        from airflow_provider_logbus.targets.iceberg_maintenance import maintain

        if self.target != "iceberg":
            raise AirflowException(f"table maintenance is for Iceberg tables; {self.table!r} is a {self.target} "
                                   "table (the directory target keeps one Parquet directory per batch, with nothing "
                                   "to expire)")
        target = resolve_target(self.target, self.table, warehouse=self.warehouse,
                                catalog_conn_id=self.catalog_conn_id)
        try:
            now = datetime.now(timezone.utc)
            now_ms = int(now.timestamp() * 1000)
            closed_before = now_ms - int(self.settle.total_seconds() * 1000)
            if self.audited_only:
                watermark = target.complete_through()
                if watermark is None:
                    self.log.info("no hour of %s was announced complete yet: nothing to compact", self.table)
                closed_before = None if watermark is None else min(closed_before, watermark)
            report = maintain(
                target, now_ms=now_ms, closed_before_ms=closed_before, target_file_bytes=self.target_file_bytes,
                expire_older_than_ms=None if self.expire_after is None else now_ms - int(
                    self.expire_after.total_seconds() * 1000),
                orphans_older_than_s=None if self.orphan_after is None else self.orphan_after.total_seconds())
        finally:
            target.close()
        for hour in report.compacted:
            self.log.info("hour %s: %d -> %d files, %s", datetime.fromtimestamp(hour.hour_ms / 1000, timezone.utc)
                          .strftime("%Y-%m-%dT%H:00Z"), hour.files_before, hour.files_after, hour.outcome)
        self.log.info("%s: %d ledger entries copied, %d snapshots expired, %d orphan files removed", self.table,
                      report.ledger_synced, report.snapshots_expired, len(report.orphans_removed))
        return report.to_dict()
