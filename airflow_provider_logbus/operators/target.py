"""Which table an operator writes to: the one place that turns operator arguments and
Airflow connections into a `CommitTarget`, so operators never branch on the kind."""

from __future__ import annotations

from airflow_provider_logbus.hooks.iceberg import DEFAULT_CONN_ID as DEFAULT_CATALOG_CONN_ID
from airflow_provider_logbus.targets import CommitTarget, open_target


def resolve_target(kind: str, table: str, *, warehouse: str | None = None,
                   catalog_conn_id: str = DEFAULT_CATALOG_CONN_ID) -> CommitTarget:
    """`kind` "directory" (Parquet under `warehouse`) or "iceberg" (the catalog of
    connection `catalog_conn_id`; without that connection, an embedded SQLite catalog
    under `warehouse`)."""
    catalog = None
    if kind == "iceberg":
        from airflow_provider_logbus.hooks.iceberg import IcebergCatalogHook

        catalog = IcebergCatalogHook(catalog_conn_id).catalog_properties(warehouse)
    return open_target(kind, table, warehouse=warehouse, catalog=catalog)
