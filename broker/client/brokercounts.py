"""Reading the brokers' record counts (`broker.common.auditcounts`, written by
`broker.server.audit`): the audit's `broker` tier, for producers that publish no
monitoring events (Kafka clients) and beside those that do."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from broker.common.auditcounts import PartitionCounts, audit_path, audit_topic_path
from broker.common.zklayout import AUDIT

Partition = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class BrokerCounts:
    """Records the brokers counted per (topic, window start), summed over partitions,
    and per partition the offsets they were counted over, `[began, upto)` less the
    ranges retention deleted first (`skipped`), and the first window whose count is
    whole (`kept_from`: older ones were pruned)."""

    counts: dict[tuple[str, int], int] = field(default_factory=dict)
    began: dict[Partition, int] = field(default_factory=dict)
    upto: dict[Partition, int] = field(default_factory=dict)
    kept_from: dict[Partition, int] = field(default_factory=dict)  # earlier windows' counts are partial
    skipped: dict[Partition, list[tuple[int, int]]] = field(default_factory=dict)  # deleted before counted

    def topics(self) -> set[str]:
        return {t for t, _ in self.began}


def read_broker_counts(zk: KazooClient, topics: Iterable[str] | None = None) -> BrokerCounts:
    """The counts of `topics` (every counted topic when None); a topic no broker has
    counted has none. A node that does not decode raises ValueError naming its path."""
    counts = BrokerCounts()
    if topics is None:
        try:
            topics = zk.get_children(AUDIT)
        except NoNodeError:
            return counts
    for topic in topics:
        try:
            partitions = zk.get_children(audit_topic_path(topic))
        except NoNodeError:
            continue
        for name in partitions:
            path = audit_path(topic, int(name))
            try:
                node = PartitionCounts.decode(zk.get(path)[0])
            except NoNodeError:
                continue
            except ValueError as exc:
                raise ValueError(f"the brokers' record counts at {path}: {exc}") from None
            key = (topic, int(name))
            counts.began[key], counts.upto[key], counts.kept_from[key] = node.began, node.upto, node.kept_from
            counts.skipped[key] = node.skipped
            for window, n in node.windows.items():
                counts.counts[(topic, window)] = counts.counts.get((topic, window), 0) + n
    return counts
