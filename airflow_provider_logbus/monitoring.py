"""Producer monitoring events (DESIGN §6) as the audit needs them: summed counts per
(topic, window_start).

The event format and the rule for combining events (keep the latest per
(producer_id, topic, window_start), then sum) belong to `broker/audit.py`; this module
reads the monitoring topic with the provider's `LogbusCluster` (leaders straight from
ZooKeeper, offsets from each leader, byte ranges read to the latest offset) and hands
the events to `broker.audit.sum_counts`. `broker.audit.read_producer_counts` reads
through the clients' watched metadata, which gave the provider empty results when
called right after opening it (see docs/provider.md), so it is not used here.
"""

from __future__ import annotations

import json
import logging

from broker.errors import UnknownTopic
from broker.message import iter_messages

from airflow_provider_logbus.cluster import LogbusCluster

logger = logging.getLogger(__name__)

MONITORING_TOPIC = "_logbus_audit"


def read_events(cluster: LogbusCluster, monitoring_topic: str = MONITORING_TOPIC) -> list[dict]:
    """Every decodable event of the monitoring topic, earliest to latest offset now."""
    try:
        offsets = cluster.partition_offsets(monitoring_topic)
    except UnknownTopic:
        return []
    events = []
    for p, o in offsets.items():
        for base, buf in cluster.read_range(monitoring_topic, p, o.earliest, o.latest):
            for m in iter_messages(buf, base):
                try:
                    event = json.loads(m.value)
                except ValueError:
                    logger.warning("skipping an unreadable monitoring event at %s-%d@%d", monitoring_topic, p, m.offset)
                    continue
                if isinstance(event, dict) and {"producer_id", "topic", "window_start", "count"} <= event.keys():
                    events.append(event)
    return events


def _sum_counts(events: list[dict]) -> dict[tuple[str, int], int]:
    """The same rule as broker.audit, for an install without the clients' module."""
    latest: dict[tuple[str, str, int], dict] = {}
    for e in events:
        if e.get("tier", "producer") != "producer":
            continue
        key = (str(e["producer_id"]), str(e["topic"]), int(e["window_start"]))
        if key not in latest or (e.get("seq", 0), e["count"]) > (latest[key].get("seq", 0), latest[key]["count"]):
            latest[key] = e
    sums: dict[tuple[str, int], int] = {}
    for (_, topic, window), e in latest.items():
        sums[(topic, window)] = sums.get((topic, window), 0) + int(e["count"])
    return sums


def read_produced_counts(cluster: LogbusCluster, monitoring_topic: str = MONITORING_TOPIC) -> dict[tuple[str, int], int]:
    """{(topic, window_start_ms): messages producers reported as sent}."""
    events = read_events(cluster, monitoring_topic)
    try:
        from broker.audit import sum_counts
    except ImportError:
        return _sum_counts(events)
    return {key: int(getattr(total, "count", total)) for key, total in sum_counts(events).items()}
