"""The batch record's file form: typed ranges inside, the same JSON as before outside."""

from __future__ import annotations

from airflow_provider_logbus.plan import Range
from airflow_provider_logbus.targets.base import BatchRecord, committed_ends

FILE_FORM = {
    "table": "tbl", "batch_id": "b2", "interval_start": "s", "interval_end": "e", "run_id": "r",
    "ranges": [{"topic": "t", "partition": 0, "start": 1000, "end": 2500}],
    "counts": [{"topic": "t", "window_start": 0, "count": 15}], "row_count": 15, "committed_at": "c",
    "attempt": "b2.1", "window_ms": 600000, "rejected": [], "rejected_count": 0, "schema": None,
    "schema_source": None, "planned_ranges": [{"topic": "t", "partition": 0, "start": 0, "end": 2500}],
    "extra": {"staging": "/s"},
}


def test_a_record_reads_typed_ranges_and_writes_the_same_file_form():
    record = BatchRecord.from_dict(FILE_FORM)
    assert record.ranges == [Range("t", 0, 1000, 2500)] and record.planned_ranges == [Range("t", 0, 0, 2500)]
    assert record.to_dict() == FILE_FORM


def test_a_record_written_before_planned_ranges_existed_still_reads():
    old = {k: v for k, v in FILE_FORM.items() if k not in ("planned_ranges", "rejected", "rejected_count")}
    record = BatchRecord.from_dict({**old, "unknown_future_field": 1})
    assert record.planned_ranges is None and record.rejected_count == 0
    assert record.end_offsets("t") == {0: 2500}


def test_committed_ends_are_the_furthest_end_per_partition():
    a = BatchRecord.from_dict(FILE_FORM)
    b = BatchRecord.from_dict({**FILE_FORM, "batch_id": "b1", "ranges": [
        {"topic": "t", "partition": 0, "start": 0, "end": 1000}, {"topic": "t", "partition": 1, "start": 0, "end": 7}]})
    assert committed_ends([a, b]) == {("t", 0): 2500, ("t", 1): 7}
