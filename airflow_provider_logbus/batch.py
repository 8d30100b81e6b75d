"""The batch protocol's cluster-facing steps, apart from Airflow: fixing a run's ranges
(the offset snapshot), committing a loaded batch with its offsets, and reading what the
audit compares. Operators call these with the cluster their `LogbusHook` built; plans
and records stay typed here and become dicts only in the operators' XCom.

The table is the source of truth for where a batch starts; ZooKeeper group offsets are
read only for a table that has no batch yet, and written after a commit only as a mirror
for lag monitoring.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime

from broker.client.brokercounts import BrokerCounts
from broker.client.monitoring import MIRROR_TIER, MONITORING_TOPIC, PRODUCER_TIER, sum_by_source, sum_counts

from airflow_provider_logbus.brokertier import broker_gaps
from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.plan import BatchPlan, Range, batch_id_for
from airflow_provider_logbus.targets import BatchRecord, CommitResult, CommitTarget, TableFile

logger = logging.getLogger(__name__)

ON_DATA_LOSS = ("fail", "skip")
OFFSET_RESETS = ("earliest", "latest")


class DataLossError(RuntimeError):
    """Retention deleted bytes that were never loaded."""


class PlanError(RuntimeError):
    """The ranges cannot be planned (a start past the end: was the topic recreated?)."""


def plan_batch(cluster: LogbusCluster, target: CommitTarget, topic: str, interval_start: datetime,
               interval_end: datetime, *, group: str | None = None, auto_offset_reset: str = "earliest",
               max_bytes_per_partition: int | None = None, on_data_loss: str = "fail") -> BatchPlan:
    """The ranges of this interval's batch (docs/provider.md, "The ranges of a batch").
    Idempotent: a committed batch returns its recorded ranges. Overlapping runs may plan
    the same ranges; the commit's compare-and-swap decides which publishes them."""
    if on_data_loss not in ON_DATA_LOSS:
        raise ValueError(f"on_data_loss must be 'fail' or 'skip', not {on_data_loss!r}")
    if auto_offset_reset not in OFFSET_RESETS:
        raise ValueError(f"auto_offset_reset must be 'earliest' or 'latest', not {auto_offset_reset!r}")
    plan = BatchPlan(batch_id=batch_id_for(interval_start, interval_end), table=target.table, topic=topic,
                     interval_start=interval_start.isoformat(), interval_end=interval_end.isoformat())
    committed = target.batch(plan.batch_id)
    if committed is not None:
        logger.info("batch %s is already committed; reusing its ranges", plan.batch_id)
        return replace(plan, ranges=tuple(r for r in committed.ranges if r.topic == topic), committed=True)
    state = target.state()
    starts = {p: end for (t, p), end in state.ends.items() if t == topic}
    source = "table"
    if not state.exists:
        starts = cluster.group_offsets(group, topic) if group else {}
        source = f"group {group!r} offsets" if group else auto_offset_reset
    ranges = []
    for p, o in cluster.partition_offsets(topic).items():
        start, how = starts.get(p), source
        if start is None:
            start, how = (o.earliest if auto_offset_reset == "earliest" else o.latest), auto_offset_reset
        r = Range(topic, p, start, o.latest)
        if start < o.earliest:
            if on_data_loss == "fail":
                raise DataLossError(
                    f"{topic}-{p}: bytes [{start}, {o.earliest}) ({o.earliest - start} bytes) were deleted by "
                    f"retention before table {target.table!r} loaded them (the earliest offset is now {o.earliest}); "
                    "raise the topic's retention or rerun with on_data_loss='skip' to load from the earliest "
                    "offset and record the loss for the audit")
            logger.warning("%s-%d: bytes [%d, %d) lost to retention; skipping to %d",
                           topic, p, start, o.earliest, o.earliest)
            r = Range(topic, p, o.earliest, o.latest, lost_start=start, lost_end=o.earliest)
        elif start > o.latest:
            raise PlanError(f"{topic}-{p}: start offset {start} (from {how}) is past the partition's end "
                            f"{o.latest}; was the topic recreated?")
        if max_bytes_per_partition and r.end - r.start > max_bytes_per_partition:
            r = Range(r.topic, r.partition, r.start,
                      cluster.boundary_at_or_before(topic, p, r.start, max_bytes_per_partition),
                      r.lost_start, r.lost_end)
        ranges.append(r)
        logger.info("%s-%d: [%d, %d) %d bytes (start from %s)", topic, p, r.start, r.end, r.end - r.start, how)
    return plan.with_ranges(ranges)


def commit_batch(target: CommitTarget, plan: BatchPlan, staging: str | None, run_id: str, *,
                 cluster: LogbusCluster | None = None, group: str | None = None) -> CommitResult:
    """Publish the batch with the compare-and-swap of `CommitTarget.commit`, then mirror
    the table's committed ends to the group's ZooKeeper offsets (lag monitoring only: a
    failure to mirror is logged, never fails the commit)."""
    result = target.commit(plan, staging, run_id)
    if cluster is not None and group:
        ends: dict[str, dict[int, int]] = {}
        for r in result.record.ranges:
            ends.setdefault(r.topic, {})[r.partition] = r.end
        for topic, offsets in ends.items():
            try:
                cluster.set_group_offsets(group, topic, offsets)
            except Exception as exc:  # noqa: BLE001 - a mirror must not undo a commit
                logger.warning("committed batch %s, but could not mirror offsets %s of %s to group %r in "
                               "ZooKeeper (lag monitoring only): %s: %s", plan.batch_id, offsets, topic, group,
                               type(exc).__name__, exc)
    return result


@dataclass(frozen=True)
class AuditInputs:
    """What `completeness.build_report` compares, per tier: messages producers sent and a
    mirror copied (per source) per (topic, window) from the monitoring events, the
    table's batch records and the data files it holds (`CommitTarget.contents`)."""

    produced: dict[tuple[str, int], int]
    mirrored: dict[str | None, dict[tuple[str, int], int]]
    batches: list[BatchRecord]
    files: list[TableFile]
    broker: BrokerCounts = field(default_factory=BrokerCounts)  # the brokers' record counts

    def report(self, table: str, topic: str, start_ms: int, end_ms: int, threshold: float) -> dict:
        """`completeness.build_report` over every tier, for [start_ms, end_ms)."""
        from airflow_provider_logbus.completeness import build_report

        return build_report(table, topic, start_ms, end_ms, self.produced, self.batches, threshold,
                            mirrored=self.mirrored, files=self.files, broker=self.broker)


def audit_inputs(cluster: LogbusCluster, target: CommitTarget, monitoring_topic: str | None = None,
                 since_ms: int | None = None, events_since_ms: int | None = None) -> AuditInputs:
    """Read every tier: the monitoring events, then the table's contents (files of hours
    before `since_ms` may be left out). `events_since_ms` skips the monitoring topic's
    segments before that time (a report of recent hours, such as the Airflow page's, does
    not scan the topic's history); its counts are exact for windows from then on only."""
    events = cluster.monitoring_events(monitoring_topic or MONITORING_TOPIC, since_ms=events_since_ms)
    counts = {source: {key: w.count for key, w in windows.items()}
              for source, windows in sum_by_source(events, MIRROR_TIER).items()}
    contents = target.contents(since_ms)
    # after the table: counts read later cover at least what it held when read
    return AuditInputs({key: w.count for key, w in sum_counts(events, PRODUCER_TIER).items()}, counts,
                       contents.batches, contents.files, cluster.broker_counts())


def await_broker_counts(cluster: LogbusCluster, inputs: AuditInputs, topic: str, timeout_s: float,
                        poll_s: float = 1.0) -> AuditInputs:
    """`inputs` with the brokers' counts read again until they cover every record the
    table's batches loaded of `topic` (`brokertier.broker_gaps`: the leaders count every
    few seconds, so an audit right after a load would find them behind), for at most
    `timeout_s`; hours still behind then are judged pending."""
    deadline = time.monotonic() + timeout_s
    while (topic in inputs.broker.topics() and broker_gaps(inputs.broker, inputs.batches, topic).behind
           and time.monotonic() < deadline):
        time.sleep(poll_s)
        inputs = replace(inputs, broker=cluster.broker_counts())
    return inputs
