"""The audit's `broker` tier (docs/provider.md, "The audit"): the records the brokers
committed per window, counted by each partition's leader (`broker.client.brokercounts`),
and the hours where those counts cannot be compared with the table's yet or at all.

The counts cover each partition's offsets `[began, upto)`, and whole windows from
`kept_from` on. So, for the batches the table holds:

* a batch that loaded offsets at or past a partition's `upto` loaded records the brokers
  have not counted yet: its hours are *behind* (pending until counting catches up — a
  few seconds — never a verdict);
* a batch that loaded offsets below a partition's `began` (records retention deleted
  before the brokers began counting: a cluster upgraded with old data) or in a range
  retention deleted before the brokers counted it (`skipped`), and an hour before
  `kept_from` (its windows were pruned), have *partial* broker counts: the tier is shown
  there but not compared, and those hours are audited as before it existed.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.client.brokercounts import BrokerCounts

from airflow_provider_logbus.targets.base import BatchRecord

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class BrokerGaps:
    """Where a topic's broker counts are behind the table (per partition, and the hours
    of the batches concerned) or partial (hours)."""

    behind: list[dict]
    behind_hours: frozenset[int]
    partial_hours: frozenset[int]
    kept_from: int

    def partial(self, hour: int) -> bool:
        return hour in self.partial_hours or hour < self.kept_from


def _hours(record: BatchRecord, topic: str) -> set[int]:
    return {int(c["window_start"]) - int(c["window_start"]) % HOUR_MS
            for c in (*record.counts, *(record.rejected or ())) if c["topic"] == topic}


def broker_gaps(broker: BrokerCounts, batches: list[BatchRecord], topic: str) -> BrokerGaps:
    """The gaps of `topic`'s broker counts against the batches' ranges."""
    behind: dict[int, dict] = {}
    behind_hours: set[int] = set()
    partial_hours: set[int] = set()
    for record in batches:
        for r in record.ranges:
            if r.topic != topic or r.end <= r.start:
                continue
            key = (topic, r.partition)
            upto = broker.upto.get(key)
            if upto is None or r.end > upto:
                behind_hours |= _hours(record, topic)
                seen = behind.setdefault(r.partition, {"partition": r.partition, "counted_to": upto, "loaded_to": 0})
                seen["loaded_to"] = max(seen["loaded_to"], r.end)
            elif r.start < broker.began[key] or any(a < r.end and r.start < b for a, b in broker.skipped.get(key, ())):
                partial_hours |= _hours(record, topic)
    kept = [k for (t, _), k in broker.kept_from.items() if t == topic]
    return BrokerGaps(sorted(behind.values(), key=lambda b: b["partition"]), frozenset(behind_hours),
                      frozenset(partial_hours), max(kept, default=0))


def behind_reason(gaps: BrokerGaps) -> str:
    """Why hours wait for the broker tier: the partitions whose counts end before what
    the table loaded."""
    return "the brokers have not counted every record the table loaded yet: " + ", ".join(
        f"partition {b['partition']} counted to {b['counted_to'] if b['counted_to'] is not None else 'nothing'}, "
        f"loaded to {b['loaded_to']}" for b in gaps.behind)
