"""What the load and commit operators report to OpenLineage (see `airflow_provider_logbus.lineage`)."""

from __future__ import annotations

from typing import Any


class ReportsBatchLineage:
    """Mixin for an operator whose `execute()` sets `batch_lineage` to the keyword
    arguments of `lineage.batch_lineage` (cluster address, table, batch id, ranges, ...).

    The OpenLineage provider calls `get_openlineage_facets_on_complete` after a successful
    `execute()`; without that provider nothing calls it, and if called anyway it
    returns None instead of failing on the missing import."""

    batch_lineage: dict[str, Any] | None = None

    def get_openlineage_facets_on_complete(self, task_instance):  # noqa: ARG002 - the OpenLineage signature
        if self.batch_lineage is None:  # nothing loaded (the batch was already committed)
            return None
        try:
            from airflow_provider_logbus.lineage import batch_lineage
        except ImportError:  # the OpenLineage provider is not installed
            return None
        return batch_lineage(**self.batch_lineage)
