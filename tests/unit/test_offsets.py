"""Consumer lag in records from leader offsets and committed group offsets
(broker.client.offsets.lag), with a fake partition that knows where its records are."""

import pytest

from broker.client.offsets import PartitionOffsets, lag


def offsets(**ranges):
    return {int(p[1:]): PartitionOffsets("t", int(p[1:]), 0, a, b) for p, (a, b) in ranges.items()}


class Records:
    """A fake leader: the record offsets of each partition (as RECORD_COUNT would count
    them), and the ranges it was asked about."""

    def __init__(self, **records):
        self.records = {int(p[1:]): sorted(r) for p, r in records.items()}
        self.asked: list[tuple[int, int, int]] = []

    def __call__(self, partition: int, start: int, end: int) -> int:
        self.asked.append((partition, start, end))
        return sum(1 for o in self.records[partition] if start <= o < end)


# partition 0: a plain entry at 0 (23 bytes), a batch of 5 at 23 (offsets 23..27, 120 bytes),
# a gzip set of 3 at 143 (offsets 143..145, 40 bytes); the end is 183
ENTRIES = [0, 23, 24, 25, 26, 27, 143, 144, 145]


def test_lag_counts_records_not_bytes_from_the_committed_offset_to_the_end():
    count = Records(p0=ENTRIES, p1=[0, 25])
    assert lag(offsets(p0=(0, 183), p1=(0, 50)), {0: 23, 1: 50}, count) == {0: 8, 1: 0}
    assert count.asked == [(0, 23, 183)], "a partition at its end needs no count"


def test_a_committed_offset_inside_a_batch_counts_the_records_after_it():
    assert lag(offsets(p0=(0, 183)), {0: 26}, Records(p0=ENTRIES)) == {0: 5}
    assert lag(offsets(p0=(0, 183)), {0: 144}, Records(p0=ENTRIES)) == {0: 2}


def test_a_partition_never_committed_counts_from_earliest_or_latest():
    o = offsets(p0=(23, 183))
    assert lag(o, {}, Records(p0=ENTRIES)) == {0: 8}
    assert lag(o, {}, Records(p0=ENTRIES), missing="latest") == {0: 0}


def test_an_offset_deleted_by_retention_counts_from_the_earliest():
    count = Records(p0=ENTRIES)
    assert lag(offsets(p0=(143, 183)), {0: 20}, count) == {0: 3}
    assert count.asked == [(0, 143, 183)]


def test_lag_is_never_negative():
    assert lag(offsets(p0=(0, 183)), {0: 250}, Records(p0=ENTRIES)) == {0: 0}


def test_missing_must_be_earliest_or_latest():
    with pytest.raises(ValueError, match="missing"):
        lag(offsets(p0=(0, 1)), {}, Records(p0=[0]), missing="smallest")
