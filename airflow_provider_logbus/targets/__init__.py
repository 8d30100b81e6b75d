"""Commit targets: where a table's batches land (docs/provider.md, "Targets").

* `directory` — Parquet directories under a local/POSIX warehouse, one rename per batch;
* `iceberg` — an Apache Iceberg table through pyiceberg; the catalog's commit publishes.

Both implement `CommitTarget`; operators and the hook use only that interface.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_logbus.targets.base import (BatchRecord, CommitConflictError, CommitResult, CommitTarget,
                                                  TableContents, TableFile, TableState, TargetError)

KINDS = ("directory", "iceberg")


def open_target(kind: str, table: str, *, warehouse: str | None = None,
                catalog: dict[str, Any] | None = None) -> CommitTarget:
    """The target `kind` for `table`. `warehouse` is the directory root (and the embedded
    Iceberg catalog's home when `catalog` is not given); `catalog` holds pyiceberg catalog
    properties."""
    if kind == "directory":
        from airflow_provider_logbus.targets.directory import DirectoryTarget

        if not warehouse:
            raise TargetError("the directory target needs a warehouse path")
        return DirectoryTarget(warehouse, table)
    if kind == "iceberg":
        from airflow_provider_logbus.targets.iceberg import IcebergTarget

        return IcebergTarget(table, catalog_properties=catalog, warehouse=warehouse)
    raise TargetError(f"unknown target {kind!r}: use one of {', '.join(KINDS)}")


__all__ = ["BatchRecord", "CommitConflictError", "CommitResult", "CommitTarget", "KINDS", "TableContents",
           "TableFile", "TableState", "TargetError", "open_target"]
