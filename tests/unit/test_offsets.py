"""Consumer lag from leader offsets and committed group offsets (broker.client.offsets.lag)."""

import pytest

from broker.client.offsets import PartitionOffsets, lag


def offsets(**ranges):
    return {int(p[1:]): PartitionOffsets("t", int(p[1:]), 0, a, b) for p, (a, b) in ranges.items()}


def test_lag_counts_bytes_from_the_committed_offset_to_the_end():
    assert lag(offsets(p0=(0, 100), p1=(0, 50)), {0: 40, 1: 50}) == {0: 60, 1: 0}


def test_a_partition_never_committed_counts_from_earliest_or_latest():
    o = offsets(p0=(10, 100))
    assert lag(o, {}) == {0: 90}
    assert lag(o, {}, missing="latest") == {0: 0}


def test_an_offset_deleted_by_retention_counts_from_the_earliest():
    assert lag(offsets(p0=(70, 100)), {0: 20}) == {0: 30}


def test_lag_is_never_negative():
    assert lag(offsets(p0=(0, 100)), {0: 150}) == {0: 0}


def test_missing_must_be_earliest_or_latest():
    with pytest.raises(ValueError, match="missing"):
        lag(offsets(p0=(0, 1)), {}, missing="smallest")
