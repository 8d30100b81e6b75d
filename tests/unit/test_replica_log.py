"""The log's replication parts on real files: a follower's append of the leader's bytes,
truncation, the leader-epoch cache and the high-watermark checkpoint."""

import pytest

from broker.common.errors import InvalidMessage, InvalidRequest
from broker.common.message import encode_message_set, iter_messages
from broker.server.log.checkpoint import read_hw_checkpoint, write_hw_checkpoint
from broker.server.log.epochs import CHECKPOINT, UNDEFINED, LeaderEpochCache
from broker.server.log.log import Log, LogConfig
from tests.unit.test_log import append, read_all


def segment_bytes(log: Log) -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in sorted(log.directory.glob("*.kafka"))]


@pytest.fixture
def pair(tmp_path):
    config = LogConfig(segment_bytes=1024)
    return Log(tmp_path / "l" / "t-0", "t", 0, config), Log(tmp_path / "f" / "t-0", "t", 0, config)


def replicate(leader: Log, follower: Log, max_bytes: int = 300) -> None:
    """Copy the leader's bytes as the fetcher does: from the follower's end, in chunks
    that may end mid-message."""
    while follower.end_offset < leader.end_offset:
        region = leader.read(follower.end_offset, max_bytes, upto=leader.end_offset)
        result = follower.append_replica(region.read())
        if result.next_offset == result.base_offset:  # a message larger than the chunk
            max_bytes *= 2


def test_a_replica_appended_in_odd_chunks_is_byte_identical(pair):
    leader, follower = pair
    for i in range(40):
        append(leader, [b"m%03d" % i * 10])
    replicate(leader, follower)
    follower.flush()
    leader.flush()
    assert segment_bytes(follower) == segment_bytes(leader)
    assert len(segment_bytes(leader)) > 1  # the comparison crossed segment rolls


def test_append_replica_refuses_a_corrupt_set(pair):
    _, follower = pair
    data = bytearray(encode_message_set([(None, b"hello", 1)]))
    data[-1] ^= 0xFF
    with pytest.raises(InvalidMessage):
        follower.append_replica(bytes(data))
    assert follower.end_offset == 0


def test_truncate_to_a_boundary_drops_later_segments_and_keeps_the_rest(pair):
    log, _ = pair
    offsets = [append(log, [b"v%03d" % i * 20]).base_offset for i in range(30)]
    log.flush()
    cut = offsets[12]
    assert log.truncate_to(cut) > 0
    assert log.end_offset == cut and log.flushed_offset == cut
    assert read_all(log) == [b"v%03d" % i * 20 for i in range(12)]
    assert append(log, [b"after"]).base_offset == cut
    log.flush()
    reopened = Log(log.directory, "t", 0, log.config, recover=True)
    assert read_all(reopened)[-1] == b"after"


def test_truncate_to_a_segment_start_and_to_zero(pair):
    log, _ = pair
    for i in range(30):
        append(log, [b"x" * 100])
    second = log.segments[1].base_offset
    log.truncate_to(second)
    assert log.end_offset == second and len(log.segments) == 1
    log.truncate_to(0)
    assert log.end_offset == 0 and log.segments[0].size == 0


def test_truncate_to_refuses_a_non_boundary(pair):
    log, _ = pair
    append(log, [b"x" * 100, b"y" * 100])
    with pytest.raises(InvalidRequest):
        log.truncate_to(7)


def test_truncation_cuts_the_epoch_cache_too(pair):
    log, _ = pair
    log.epochs.assign(0, 0)
    append(log, [b"a"])
    log.epochs.assign(1, log.end_offset)
    end = log.end_offset
    append(log, [b"b"])
    log.truncate_to(end)
    assert log.epochs.entries == [(0, 0)]


def test_consumers_see_up_to_the_high_watermark_only(pair):
    log, _ = pair
    first = append(log, [b"a"]).next_offset
    append(log, [b"b"])
    log.flush()
    log.high_watermark = first
    assert log.visible_offset == first
    assert [m.value for m in iter_messages(log.read(0, 1 << 20).read(), 0)] == [b"a"]
    assert log.offsets_before(-1) == [first]
    assert len(log.read(0, 1 << 20, upto=log.end_offset)) == log.end_offset  # a follower's fetch reads on


def test_epoch_cache_answers_where_each_epoch_ends(tmp_path):
    cache = LeaderEpochCache(tmp_path)
    assert cache.latest_epoch == UNDEFINED
    assert cache.end_offset_for(3, 500) == (UNDEFINED, 500)
    cache.assign(1, 0)
    cache.assign(3, 100)
    cache.assign(2, 150)  # older than the latest: ignored
    cache.assign(5, 300)
    assert cache.end_offset_for(0, 500) == (UNDEFINED, 0)
    assert cache.end_offset_for(1, 500) == (1, 100)
    assert cache.end_offset_for(2, 500) == (1, 100)
    assert cache.end_offset_for(4, 500) == (3, 300)
    assert cache.end_offset_for(5, 500) == (5, 500)
    assert cache.end_offset_for(9, 500) == (5, 500)
    assert (tmp_path / CHECKPOINT).read_text() == "1 0\n3 100\n5 300\n"
    cache.truncate_from(300)
    assert LeaderEpochCache(tmp_path).entries == [(1, 0), (3, 100)]
    assert LeaderEpochCache(tmp_path).latest_epoch == 3


def test_a_new_epoch_supersedes_entries_past_its_start(tmp_path):
    cache = LeaderEpochCache(tmp_path)
    cache.assign(1, 0)
    cache.assign(2, 100)
    cache.assign(4, 50)
    assert cache.entries == [(1, 0), (4, 50)]


def test_hw_checkpoint_round_trips(tmp_path):
    assert read_hw_checkpoint(tmp_path) == {}
    write_hw_checkpoint(tmp_path, {("a-b", 0): 10, ("c", 3): 0})
    assert (tmp_path / "replication-offset-checkpoint").read_text() == "a-b 0 10\nc 3 0\n"
    assert read_hw_checkpoint(tmp_path) == {("a-b", 0): 10, ("c", 3): 0}
