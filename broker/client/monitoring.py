"""Monitoring events (docs/clients.md, "Monitoring events"), the reader's side: messages
producers sent per (topic, window_start), as the Airflow audit compares them with the
warehouse's counts.

`read_producer_counts()` reads every partition of the monitoring topic from its
earliest to its latest offset with a `SimpleConsumer` and sums the latest event per
`(producer_id, topic, window_start)` (events are cumulative and published repeatedly,
see `broker.client.audit`, which writes them).
"""

from __future__ import annotations

import json
import logging

from broker.client.audit import AUDIT_TOPIC, WindowCount
from broker.client.cluster import ClusterMetadata, open_metadata
from broker.client.consumer import SimpleConsumer

logger = logging.getLogger(__name__)


def latest_events(events) -> dict[tuple[str, str, int], dict]:
    """The latest event per (producer_id, topic, window_start): highest `seq`, then
    highest count (counts are cumulative, so the larger one is never older)."""
    latest: dict[tuple[str, str, int], dict] = {}
    for event in events:
        if event.get("tier", "producer") != "producer":
            continue
        key = (event["producer_id"], event["topic"], int(event["window_start"]))
        known = latest.get(key)
        rank = (event.get("seq", 0), event["count"])
        if known is None or rank > (known.get("seq", 0), known["count"]):
            latest[key] = event
    return latest


def sum_counts(events) -> dict[tuple[str, int], WindowCount]:
    """Messages produced per (topic, window_start), over all producers."""
    totals: dict[tuple[str, int], WindowCount] = {}
    for (_, topic, start), event in latest_events(events).items():
        total = totals.setdefault((topic, start), WindowCount())
        total.count += int(event["count"])
        total.bytes += int(event.get("bytes", 0))
    return totals


def read_events(zookeeper: str | None = None, brokers: list[str] | str | None = None,
                audit_topic: str = AUDIT_TOPIC, metadata: ClusterMetadata | None = None) -> list[dict]:
    """Every decodable event in the monitoring topic, read from earliest to the latest
    offset at the time of the call; an absent topic has no events."""
    own = metadata is None
    metadata = metadata or open_metadata(zookeeper, brokers)
    events = []
    try:
        leaders = metadata.partitions(audit_topic)
        for partition in sorted(leaders or {}):
            consumer = SimpleConsumer(audit_topic, partition, metadata=metadata, offset="smallest", max_wait_ms=0)
            try:
                end = consumer.latest()
                while consumer.offset < end:
                    batch = consumer.fetch()
                    if not batch:
                        break
                    for message in batch:
                        try:
                            events.append(json.loads(message.value))
                        except ValueError:
                            logger.warning("skipping an unreadable monitoring event at %s-%d@%d",
                                           audit_topic, partition, message.offset)
            finally:
                consumer.close()
    finally:
        if own:
            metadata.close()
    return events


def read_producer_counts(zookeeper: str | None = None, brokers: list[str] | str | None = None,
                         audit_topic: str = AUDIT_TOPIC,
                         metadata: ClusterMetadata | None = None) -> dict[tuple[str, int], WindowCount]:
    """Messages produced per (topic, window_start) according to the monitoring topic."""
    return sum_counts(read_events(zookeeper, brokers, audit_topic, metadata))
