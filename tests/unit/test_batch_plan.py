"""`batch.plan_batch`'s rules on a real (directory) table, given the partition offsets a
cluster would report — the planning rules, apart from reading a broker."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from airflow_provider_logbus.batch import DataLossError, PlanError, plan_batch
from airflow_provider_logbus.cluster import PartitionOffsets
from airflow_provider_logbus.plan import Range
from airflow_provider_logbus.targets.directory import DirectoryTarget

START, END = datetime(2024, 1, 1, tzinfo=timezone.utc), datetime(2024, 1, 1, 1, tzinfo=timezone.utc)


class Offsets:
    """What plan_batch asks of a cluster: each partition's offsets and a group's."""

    def __init__(self, offsets: dict[int, tuple[int, int]], group: dict[int, int] | None = None) -> None:
        self.offsets, self.group = offsets, group or {}

    def partition_offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        return {p: PartitionOffsets(topic, p, 0, earliest, latest) for p, (earliest, latest) in self.offsets.items()}

    def group_offsets(self, group: str, topic: str) -> dict[int, int]:
        return dict(self.group)


def test_a_new_table_starts_at_the_earliest_offsets(tmp_path):
    plan = plan_batch(Offsets({0: (0, 100), 1: (40, 90)}), DirectoryTarget(tmp_path, "tbl"), "t", START, END)
    assert plan.batch_id == "20240101T000000_20240101T010000" and not plan.committed
    assert plan.ranges == (Range("t", 0, 0, 100), Range("t", 1, 40, 90))


def test_a_new_table_with_a_group_starts_at_its_offsets(tmp_path):
    plan = plan_batch(Offsets({0: (0, 100)}, group={0: 60}), DirectoryTarget(tmp_path, "tbl"), "t", START, END,
                      group="loader")
    assert plan.ranges == (Range("t", 0, 60, 100),)


def test_bytes_deleted_before_loading_fail_the_plan_or_are_recorded_as_lost(tmp_path):
    cluster, target = Offsets({0: (50, 100)}, group={0: 10}), DirectoryTarget(tmp_path, "tbl")
    with pytest.raises(DataLossError, match=r"t-0: bytes \[10, 50\) \(40 bytes\) were deleted"):
        plan_batch(cluster, target, "t", START, END, group="g")
    plan = plan_batch(cluster, target, "t", START, END, group="g", on_data_loss="skip")
    assert plan.ranges == (Range("t", 0, 50, 100, lost_start=10, lost_end=50),)


def test_a_start_past_the_partitions_end_is_refused(tmp_path):
    with pytest.raises(PlanError, match="was the topic recreated"):
        plan_batch(Offsets({0: (0, 100)}, group={0: 500}), DirectoryTarget(tmp_path, "tbl"), "t", START, END,
                   group="g")


def test_unknown_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="on_data_loss"):
        plan_batch(Offsets({}), DirectoryTarget(tmp_path, "tbl"), "t", START, END, on_data_loss="ignore")
