"""Producer monitoring events (docs/clients.md, "Monitoring events") as the audit needs
them: messages produced per (topic, window_start).

The event format, the reader and the rule for combining events (keep the latest per
(producer_id, topic, window_start), then sum) live in the client library
(`broker.client.monitoring` writes and reads them); this module
reads through the provider's cluster handle, on its metadata.
"""

from __future__ import annotations

from broker.client.monitoring import MONITORING_TOPIC, read_producer_counts

from airflow_provider_logbus.cluster import LogbusCluster


def read_produced_counts(cluster: LogbusCluster,
                         monitoring_topic: str = MONITORING_TOPIC) -> dict[tuple[str, int], int]:
    """{(topic, window_start_ms): messages producers reported as sent}."""
    counts = read_producer_counts(monitoring_topic=monitoring_topic, metadata=cluster.metadata)
    return {key: total.count for key, total in counts.items()}
