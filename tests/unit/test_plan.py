"""The batch plan's records: their serialized forms, and rebasing a plan onto the table's
committed ends (the losing side of a commit race)."""

from __future__ import annotations

import json

import pytest

from airflow_provider_logbus.plan import BatchPlan, Range, batch_id_for, ranges_from_json, ranges_to_json, rebase


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


def test_a_range_without_loss_serializes_without_the_loss_fields():
    assert Range("t", 0, 1, 2).to_dict() == {"topic": "t", "partition": 0, "start": 1, "end": 2}
    lossy = Range("t", 0, 5, 9, lost_start=1, lost_end=5)
    assert Range.from_dict(lossy.to_dict()) == lossy


def test_ranges_round_trip_through_the_load_jobs_json_argument():
    ranges = [Range("t", 0, 0, 10), Range("u", 3, 7, 7, lost_start=2, lost_end=7)]
    assert ranges_from_json(ranges_to_json(ranges)) == ranges
    assert json.loads(ranges_to_json(ranges))[0] == {"topic": "t", "partition": 0, "start": 0, "end": 10}


def test_a_plan_read_from_xcom_strings_gets_its_types():
    plan = BatchPlan.from_dict({"batch_id": "b", "table": "tbl", "topic": "t", "interval_start": "s",
                                "interval_end": "e", "ranges": [{"topic": "t", "partition": "1", "start": "4",
                                                                 "end": "8"}], "warehouse": "/wh"})
    assert plan.ranges == (Range("t", 1, 4, 8),) and plan.committed is False


def test_rebase_inside_lost_bytes_keeps_the_loss_record_from_the_committed_end():
    lossy = Range("t", 0, 900, 1000, lost_start=100, lost_end=900)
    assert rebase([lossy], {("t", 0): 500}) == [Range("t", 0, 900, 1000, lost_start=500, lost_end=900)]


def test_batch_id_is_the_interval_in_utc():
    from datetime import datetime, timedelta, timezone

    plus_two = timezone(timedelta(hours=2))
    assert batch_id_for(datetime(2024, 1, 1, 2, tzinfo=plus_two), datetime(2024, 1, 1, 3, tzinfo=plus_two)) == \
        "20240101T000000_20240101T010000"
