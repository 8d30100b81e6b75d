"""Producer monitoring events (DESIGN §6) as the audit needs them: messages produced
per (topic, window_start).

The event format, the reader and the rule for combining events (keep the latest per
(producer_id, topic, window_start), then sum) all live in `broker/audit.py`, shared with
the producers that write the events; this module only adapts the provider's
`LogbusCluster` address to it.
"""

from __future__ import annotations

from broker.client.monitoring import AUDIT_TOPIC, read_producer_counts

from airflow_provider_logbus.cluster import LogbusCluster

MONITORING_TOPIC = AUDIT_TOPIC


def read_produced_counts(cluster: LogbusCluster, monitoring_topic: str = MONITORING_TOPIC) -> dict[tuple[str, int], int]:
    """{(topic, window_start_ms): messages producers reported as sent}."""
    if cluster.zookeeper:
        counts = read_producer_counts(zookeeper=cluster.zookeeper, audit_topic=monitoring_topic)
    else:
        brokers = [f"{host}:{port}" for host, port in cluster.static_brokers]
        counts = read_producer_counts(brokers=brokers, audit_topic=monitoring_topic)
    return {key: total.count for key, total in counts.items()}
