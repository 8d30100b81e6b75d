"""Producer monitoring events (DESIGN §6) as the audit needs them: summed counts per
(topic, window_start).

The reader lives in `broker/audit.py` (the clients' side owns the event format); this
module only adapts to it. `read_produced_counts` uses `broker.audit`'s reader when that
module provides one and otherwise reads the monitoring topic itself with the same rule:
keep the latest event per (producer_id, topic, window_start), then sum.
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
        from broker import audit as broker_audit  # written by the clients' side
    except ImportError:
        broker_audit = None
    reader = getattr(broker_audit, "read_producer_counts", None) if broker_audit else None
    if reader is not None:
        return reader(cluster, monitoring_topic)
    return _own_reader(cluster, monitoring_topic)
