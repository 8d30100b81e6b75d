"""Producer monitoring events (DESIGN §6) as the audit needs them: summed counts per
(topic, window_start).

The reader lives in `broker/audit.py` (the clients' side owns the event format); this
module only adapts it to plain counts. `_own_reader` is a fallback with the same rule
(keep the latest event per (producer_id, topic, window_start), then sum) for an install
without the clients' module.
"""

from __future__ import annotations

import json
import logging

from broker.message import iter_messages

from airflow_provider_logbus.cluster import LogbusCluster

logger = logging.getLogger(__name__)

MONITORING_TOPIC = "_logbus_audit"


def _own_reader(cluster: LogbusCluster, monitoring_topic: str) -> dict[tuple[str, int], int]:
    from broker.errors import UnknownTopic

    latest: dict[tuple[str, str, int], tuple[tuple[int, int, int], int]] = {}
    try:
        offsets = cluster.partition_offsets(monitoring_topic)
    except UnknownTopic:
        return {}
    for p, o in offsets.items():
        for base, buf in cluster.read_range(monitoring_topic, p, o.earliest, o.latest):
            for m in iter_messages(buf, base):
                try:
                    event = json.loads(m.value)
                except ValueError:
                    continue
                if not isinstance(event, dict) or event.get("tier", "producer") != "producer":
                    continue
                try:
                    key = (str(event["producer_id"]), str(event["topic"]), int(event["window_start"]))
                    count = int(event["count"])
                except (KeyError, TypeError, ValueError):
                    continue
                order = (m.timestamp, p, m.offset)
                if key not in latest or latest[key][0] <= order:
                    latest[key] = (order, count)
    sums: dict[tuple[str, int], int] = {}
    for (_, topic, window), (_, count) in latest.items():
        sums[(topic, window)] = sums.get((topic, window), 0) + count
    return sums


def read_produced_counts(cluster: LogbusCluster, monitoring_topic: str = MONITORING_TOPIC) -> dict[tuple[str, int], int]:
    """{(topic, window_start_ms): messages producers reported as sent}."""
    try:
        from broker.audit import read_producer_counts  # the clients' reader (DESIGN §6)
    except ImportError:  # the clients' side not installed: same rule, our own reading
        return _own_reader(cluster, monitoring_topic)
    brokers = [f"{h}:{p}" for h, p in cluster.static_brokers] or None
    totals = read_producer_counts(zookeeper=cluster.zookeeper, brokers=brokers, audit_topic=monitoring_topic)
    return {key: int(getattr(total, "count", total)) for key, total in totals.items()}
