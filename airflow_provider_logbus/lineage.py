"""OpenLineage for the load and commit operators: which offsets made which batch.

A batch's lineage is its topic as the input — with the exact byte ranges per partition it
read, in the `logbusOffsetRanges` input facet — and its table as the output, with the
batch id (and, once committed, its row count) in the `logbusBatch` output facet. The
load reports the planned ranges (staged, not yet published); the commit reports the
ranges it published, which differ when it re-planned after another run committed first.

Naming (docs/provider.md, "Lineage"): a topic is dataset `<topic>` in namespace
`logbus://<ZooKeeper connect string>` (or `logbus://<brokers>` for a static-broker
connection); a table is named by its target (`CommitTarget.dataset`).

Imported only by the operators' `get_openlineage_facets_on_*` methods, which only the
OpenLineage provider calls: without that provider nothing here is imported.
"""

from __future__ import annotations

from typing import Any, Iterable

from attrs import define
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import InputDatasetFacet, OutputDatasetFacet

from airflow.providers.openlineage.extractors import OperatorLineage

from airflow_provider_logbus.plan import Range

SCHEMA_BASE = "https://example.invalid/logbus/openlineage/1-0-0"


@define
class LogbusOffsetRangesInputFacet(InputDatasetFacet):
    """The byte ranges [start, end) per partition of the topic that a batch holds;
    `lost_start`/`lost_end` when retention deleted bytes before they were loaded."""

    batchId: str  # noqa: N815 - OpenLineage facets use camelCase
    ranges: list[dict[str, int]]

    @staticmethod
    def _get_schema() -> str:
        return f"{SCHEMA_BASE}/LogbusOffsetRangesInputFacet.json"


@define
class LogbusBatchOutputFacet(OutputDatasetFacet):
    """The batch a task wrote to the table: staged by the load, published by the commit
    (`published`, with its row count)."""

    batchId: str  # noqa: N815
    published: bool
    rowCount: int | None = None  # noqa: N815

    @staticmethod
    def _get_schema() -> str:
        return f"{SCHEMA_BASE}/LogbusBatchOutputFacet.json"


def cluster_namespace(address: dict[str, Any]) -> str:
    """`logbus://<zookeeper>` or `logbus://<brokers>` of a `LogbusHook.cluster_address()`."""
    return f"logbus://{address['zookeeper'] or address['brokers']}"


def batch_lineage(address: dict[str, Any], table: tuple[str, str], batch_id: str, ranges: Iterable[Range], *,
                  published: bool = False, row_count: int | None = None) -> OperatorLineage:
    """One input per topic of `ranges` (their ranges in its facet), the table as output."""
    per_topic: dict[str, list[dict[str, int]]] = {}
    for r in ranges:
        span = {k: v for k, v in r.to_dict().items() if k != "topic"}
        per_topic.setdefault(r.topic, []).append(span)
    namespace = cluster_namespace(address)
    inputs = [InputDataset(namespace=namespace, name=topic, inputFacets={
        "logbusOffsetRanges": LogbusOffsetRangesInputFacet(batchId=batch_id, ranges=spans)})
        for topic, spans in sorted(per_topic.items())]
    output = OutputDataset(namespace=table[0], name=table[1], outputFacets={
        "logbusBatch": LogbusBatchOutputFacet(batchId=batch_id, published=published, rowCount=row_count)})
    return OperatorLineage(inputs=inputs, outputs=[output])
