"""Rebasing a plan onto the table's committed ends (the losing side of a commit race)."""

from __future__ import annotations

import pytest

from airflow_provider_logbus.plan import BatchPlan, Range, rebase


def test_rebase_keeps_ranges_that_start_at_the_committed_end():
    ranges = [Range("t", 0, 100, 200), Range("t", 1, 0, 50)]
    assert rebase(ranges, {("t", 0): 100}) == ranges


def test_rebase_moves_an_overlapped_range_to_the_committed_end():
    assert rebase([Range("t", 0, 100, 300)], {("t", 0): 200}) == [Range("t", 0, 200, 300)]


def test_rebase_empties_a_range_the_winner_covered_entirely():
    assert rebase([Range("t", 0, 100, 300)], {("t", 0): 500}) == [Range("t", 0, 500, 500)]


def test_rebase_refuses_a_committed_end_behind_the_start():
    with pytest.raises(ValueError, match=r"committed end 50 is behind this batch's start 100"):
        rebase([Range("t", 0, 100, 300)], {("t", 0): 50})


def test_rebase_compares_a_lossy_range_by_its_lost_start():
    lossy = Range("t", 0, 900, 1000, lost_start=100, lost_end=900)
    assert rebase([lossy], {("t", 0): 100}) == [lossy]
    assert rebase([lossy], {("t", 0): 950}) == [Range("t", 0, 950, 1000)]


def test_plan_round_trips_through_xcom_dicts():
    plan = BatchPlan("b", "tbl", "t", "2024-01-01T00:00:00+00:00", "2024-01-01T01:00:00+00:00",
                     (Range("t", 0, 0, 10), Range("t", 1, 5, 5, lost_start=1, lost_end=5)))
    assert BatchPlan.from_dict(plan.to_dict()) == plan
    assert plan.with_ranges([Range("t", 0, 10, 10)]).ranges == (Range("t", 0, 10, 10),)
