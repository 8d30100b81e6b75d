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


def test_after_a_kill_9_with_a_torn_tail_and_damaged_sidecars_every_offset_answers_as_before(cluster, zk):
    """Recovery rebuilds the entry index (docs/storage.md, "Entry index"): a broker killed
    with a torn write at the end of its active segment, one sealed segment's index
    sidecar deleted and another's corrupted, answers a fetch at every position and the
    count between sampled positions exactly as the records read before the kill say."""
    broker = cluster.start_broker(0, {"log.segment.bytes": 1024})
    create_topic(zk, "crashed", 1)
    with connect(broker) as conn:
        produce_mix(conn, "crashed", rounds=3)
        records = every_record(conn, "crashed")
    broker.kill()
    directory = broker.log_dir / "crashed-0"
    segments = sorted(directory.glob("*.kafka"), key=lambda p: int(p.stem))
    sidecars = [p.with_suffix(".index") for p in segments[:-1]]
    assert len(sidecars) >= 2 and all(p.exists() for p in sidecars), "rolled segments keep an index sidecar"
    with open(segments[-1], "ab") as file:
        batch = records[1].offset  # the first batch: longer than 60 bytes
        file.write(segments[0].read_bytes()[batch : batch + 60])  # a torn write: an entry's first 60 bytes
    sidecars[0].unlink()
    damaged = bytearray(sidecars[1].read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    sidecars[1].write_bytes(bytes(damaged))
    broker = cluster.start_broker(0)
    with connect(broker) as conn:
        assert every_record(conn, "crashed") == records
        check_every_offset(conn, "crashed", records)
    assert sidecars[0].exists(), "the missing sidecar was rebuilt (and saved) at first use"
