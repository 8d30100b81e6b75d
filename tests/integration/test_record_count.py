"""RECORD_COUNT against a real broker, through `broker.client.offsets.records_between`:
the records between any two offsets of plain, batched and compressed entries, the
range clamped to what the partition holds, and bad ranges refused with the reason."""

from __future__ import annotations

import bisect

import pytest

from broker.client import offsets
from broker.client.cluster import ConnectionPool
from broker.client.metadata import open_metadata
from broker.common.errors import InvalidRequest, OffsetOutOfRange
from broker.common.protocol import RecordCount
from broker.common.zklayout import create_topic
from tests.integration.brokerutil import connect
from tests.integration.recordutil import check_every_offset, every_record, produce_mix


@pytest.fixture
def mixed(cluster, zk, zk_connect):
    broker = cluster.start_broker(0, {"log.segment.bytes": 1024})
    create_topic(zk, "mixed", 1)
    with connect(broker) as conn:
        produce_mix(conn, "mixed", rounds=2)
        yield conn


def test_records_between_any_two_offsets_and_a_fetch_at_any_offset(mixed):
    records = every_record(mixed, "mixed")
    assert len(records) == 2 * (1 + 5 + 4 + 6 + 3 + 1 + 2)
    check_every_offset(mixed, "mixed", records)


def test_records_between_through_the_pool_clamps_the_range_and_names_bad_ones(mixed, zk_connect):
    records = every_record(mixed, "mixed")
    offsets_ = [m.offset for m in records]
    end = records[-1].next_offset
    pool = ConnectionPool(open_metadata(zookeeper=zk_connect), "test", 10.0, 0.0)
    try:
        assert offsets.records_between(pool, "mixed", 0, 0) == RecordCount(len(records), 0, end)
        inside = records[3].offset  # a record inside the first batch
        assert offsets.records_between(pool, "mixed", 0, inside, end + 500) == RecordCount(len(records) - 3, inside, end)
        middle = (end // 2) | 1
        assert offsets.records_between(pool, "mixed", 0, middle).records == len(records) - bisect.bisect_left(offsets_, middle)
        with pytest.raises(OffsetOutOfRange, match="past the end"):
            offsets.records_between(pool, "mixed", 0, end + 1)
        with pytest.raises(InvalidRequest, match="below start_offset"):
            offsets.records_between(pool, "mixed", 0, 50, 10)
    finally:
        pool.close()
        pool.metadata.close()
