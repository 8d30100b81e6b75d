"""The brokers' record counts (broker.common.auditcounts, broker.server.audit): records
of the committed log per window of their timestamp, kept in a real ZooKeeper node, and
exact when two brokers both count the same partition."""

from __future__ import annotations

import json
import shutil

import pytest

from broker.common.auditcounts import WINDOW_MS, PartitionCounts, audit_path
from broker.common.message import BatchIdentity, batch_identity, encode_batch, encode_message_set, iter_messages, scan
from broker.common.zklayout import topic_path
from broker.server.audit import RecordCounter
from broker.server.log.log import Log, LogConfig

NOW = 1_700_000_000_000 - 1_700_000_000_000 % WINDOW_MS
OLD = NOW - 5 * 3_600_000  # five hours ago: a late record counts in its own window


def append(log: Log, data: bytes) -> None:
    result = scan(data)
    log.append(data, result.count, result.min_timestamp, result.max_timestamp,
               batch=batch_identity(data) if result.batches else None, records=result.records)


def fill(log: Log) -> dict[int, int]:
    """Plain entries, a compressed set and an idempotent batch, of old and current
    timestamps; the counts they must give per window."""
    append(log, encode_message_set([(None, b"a%d" % i, NOW + i) for i in range(5)]))
    append(log, encode_message_set([(None, b"old%d" % i, OLD + 1) for i in range(40)], "gzip"))
    append(log, encode_batch([(None, b"b%d" % i, NOW + WINDOW_MS) for i in range(7)], BatchIdentity(7, 0, 0, 7)))
    log.flush()
    return {NOW: 5, OLD - OLD % WINDOW_MS: 40, NOW + WINDOW_MS: 7}


@pytest.fixture
def log(tmp_path):
    log = Log(tmp_path / "events-0", "events", 0, LogConfig())
    yield log
    log.close()


def counter(zk, **kw) -> RecordCounter:
    """A counter of the topic `events`, which exists: a partition's first counts are
    written only while its topic does."""
    zk.ensure_path(topic_path("events"))
    return RecordCounter(zk, kw.pop("retention_ms", 7 * 86_400_000), kw.pop("max_bytes", 1 << 20),
                         clock=lambda: NOW, **kw)


def node(zk, topic="events", partition=0) -> PartitionCounts:
    return PartitionCounts.decode(zk.get(audit_path(topic, partition))[0])


def test_counts_every_committed_record_in_the_window_of_its_timestamp(zk, log):
    expected = fill(log)
    assert counter(zk).advance(log)
    counts = node(zk)
    assert counts.windows == expected
    assert (counts.began, counts.upto) == (0, log.visible_offset)
    assert sum(1 for _ in iter_messages(log.read(0, 1 << 20).read(), 0)) == sum(expected.values())


def test_nothing_past_the_visible_offset_is_counted(zk, log):
    fill(log)
    log.high_watermark = len(encode_message_set([(None, b"a%d" % i, NOW + i) for i in range(5)]))  # 5 entries
    assert counter(zk).advance(log)
    assert node(zk).windows == {NOW: 5}


def test_a_bounded_round_catches_up_over_several_rounds_exactly(zk, log):
    expected = fill(log)
    for i in range(300):
        append(log, encode_message_set([(None, b"x" * 200, NOW + i)]))
    log.flush()
    expected[NOW] += 300
    c = counter(zk, max_bytes=1024)
    rounds = 0
    while c.advance(log):
        rounds += 1
    assert rounds > 5
    assert node(zk).windows == expected and node(zk).upto == log.visible_offset


def test_a_deposed_leaders_late_write_fails_and_the_node_never_moves_back(zk, log, tmp_path):
    """Two brokers both count the partition (a deposed leader that has not heard yet):
    each on its own copy of the same committed log, the deposed one's high watermark
    behind. The one whose view of the node is stale loses the conditional write,
    re-reads, and continues from the winner's `upto` — its own, older count never
    replaces the node's (the audit would see counts fall)."""
    expected = fill(log)
    log.close()
    shutil.copytree(tmp_path / "events-0", tmp_path / "copy" / "events-0")
    old_leader_log = Log(tmp_path / "events-0", "events", 0, LogConfig())
    new_leader_log = Log(tmp_path / "copy" / "events-0", "events", 0, LogConfig())
    try:
        first = old_leader_log.segments[0].end_offset
        old_leader_log.high_watermark = new_leader_log.high_watermark = first
        old, new = counter(zk), counter(zk)
        assert old.advance(old_leader_log)  # the old leader counts up to the first committed offset
        for l in (old_leader_log, new_leader_log):
            append(l, encode_message_set([(None, b"late%d" % i, NOW + 2) for i in range(11)]))
            l.high_watermark = l.end_offset
            append(l, encode_message_set([(None, b"later%d" % i, NOW + 3) for i in range(5)]))
            l.flush()
        new_leader_log.high_watermark = new_leader_log.end_offset
        assert new.advance(new_leader_log)  # the new leader continues from the node
        assert node(zk).upto == new_leader_log.end_offset
        assert not old.advance(old_leader_log)  # stale version: re-read, nothing left to count below its HW
        assert node(zk).upto == new_leader_log.end_offset
        counts = node(zk)
        assert counts.windows == {**expected, NOW: expected[NOW] + 16}
        assert counts.upto == old_leader_log.end_offset == new_leader_log.end_offset
    finally:
        old_leader_log.close()
        new_leader_log.close()


def test_windows_older_than_the_horizon_are_pruned_into_one_count(zk, log):
    expected = fill(log)
    counter(zk, retention_ms=3_600_000).advance(log)  # one hour: the five-hour-old window is dropped
    counts = node(zk)
    assert counts.windows == {w: n for w, n in expected.items() if w >= NOW}
    assert counts.pruned == 40 and counts.kept_from == NOW - 3_600_000


def test_records_retention_deleted_before_they_were_counted_are_named(zk, tmp_path):
    log = Log(tmp_path / "events-0", "events", 0, LogConfig(segment_bytes=1024, retention_ms=1000))
    try:
        one = encode_message_set([(None, b"x" * 100, NOW)])
        for i in range(30):
            append(log, one)
        log.flush()
        log.high_watermark = len(one)
        assert counter(zk).advance(log)  # counting began, and fell behind
        log.high_watermark = None
        assert log.delete_old_segments(NOW + 10**9)  # retention takes all but the active segment
        assert counter(zk).advance(log)
        counts = node(zk)
        assert (counts.began, counts.skipped) == (0, [(len(one), log.start_offset)])
        assert counts.windows[NOW] == 1 + log.record_count(log.start_offset)[0]
    finally:
        log.close()


def test_an_undecodable_entry_on_disk_is_passed_over_and_named_and_a_damaged_record_still_counts(zk, log):
    """A compressed set whose bytes no longer decompress holds no countable records: it
    is passed over (`unreadable`). A plain record with a damaged value is still a
    committed record: counted, so the table that cannot load it shows it missing."""
    append(log, encode_message_set([(None, b"a", NOW)]))
    damaged_set = log.end_offset
    append(log, encode_message_set([(None, b"b%d" % i, NOW) for i in range(20)], "gzip"))
    damaged_value = log.end_offset
    append(log, encode_message_set([(None, b"c", NOW)]))
    log.flush()
    with open(log.segments[0].path, "r+b") as f:
        f.seek(damaged_set + 40)
        f.write(b"\xff" * 8)
        f.seek(log.end_offset - 1)
        f.write(b"Z")
    assert damaged_value < log.end_offset
    counter(zk).advance(log)
    counts = node(zk)
    assert (counts.windows, counts.unreadable, counts.upto) == ({NOW: 2}, 1, log.end_offset)


def test_excluded_topics_are_never_counted(zk, tmp_path):
    log = Log(tmp_path / "_logbus_monitoring-0", "_logbus_monitoring", 0, LogConfig())
    try:
        append(log, encode_message_set([(None, b"{}", NOW)]))
        log.flush()
        counter(zk, excluded=("_logbus_monitoring",)).advance_all([log])
        assert not zk.exists(audit_path("_logbus_monitoring", 0))
    finally:
        log.close()


def test_a_node_that_is_not_ours_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="not a record-count node .*KeyError"):
        PartitionCounts.decode(json.dumps({"windows": {}}).encode())
    counts = PartitionCounts(10, 0, {NOW: 3}, 1, 2, [(4, 8)], NOW)
    assert PartitionCounts.decode(counts.encode()) == counts


def test_the_timestamp_walk_gives_what_the_reference_decoder_gives():
    from broker.common.records import record_timestamps

    data = b"".join([
        encode_message_set([(b"k", b"a%d" % i, NOW - i * 7_919_000) for i in range(9)]),
        encode_message_set([(None, b"z%d" % i, NOW + i) for i in range(30)], "gzip"),
        encode_batch([(None, b"b%d" % i, OLD + i * 600_001) for i in range(12)], BatchIdentity(3, 0, 0, 12), "gzip"),
        encode_batch([(b"key", b"c", NOW)], BatchIdentity(3, 0, 12, 1)),
    ])
    timestamps, stop = record_timestamps(data)
    assert stop == len(data)
    assert list(timestamps) == [m.timestamp for m in iter_messages(data, 0)]
    assert record_timestamps(data + data[:10])[1] == len(data)  # a partial tail is not read


@pytest.mark.parametrize("codec", [0, 1])  # none, gzip
def test_stored_kafka_batches_count_each_record_in_the_window_of_its_own_timestamp(zk, log, codec):
    """A Kafka client's batch (magic 4, as kafka-python builds it) whose records span
    three windows and an old hour, beside native entries: every record in its window."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from broker.common.kafka.records import check_batch

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    stamps = [NOW + i * WINDOW_MS // 4 for i in range(10)] + [OLD] * 3
    for i, ts in enumerate(stamps):
        builder.append(i, timestamp=ts, key=None, value=b"k%d" % i, headers=[])
    batch = bytes(builder.build())
    append(log, encode_message_set([(None, b"native", NOW)]))
    log.append_kafka(batch, check_batch(batch), 0)
    log.flush()
    counter(zk).advance(log)
    expected: dict[int, int] = {}
    for ts in [NOW, *stamps]:
        expected[ts - ts % WINDOW_MS] = expected.get(ts - ts % WINDOW_MS, 0) + 1
    counts = node(zk)
    assert counts.windows == expected and len(expected) == 4
    assert (counts.upto, counts.unreadable) == (log.end_offset, 0)


def test_a_bounded_round_over_a_backlog_of_many_segments_catches_up_exactly(zk, tmp_path):
    """A round whose budget ends inside a chunk stops there: the rest of that chunk and
    the next segments' are the next round's (a round that read on counted nothing)."""
    log = Log(tmp_path / "events-0", "events", 0, LogConfig(segment_bytes=2048))
    try:
        for i in range(300):
            append(log, encode_message_set([(None, b"x" * 200, NOW + i)]))
        log.flush()
        assert len(log.segments) > 5
        c = counter(zk, max_bytes=1000)
        rounds = 0
        while c.advance(log):
            rounds += 1
        assert rounds > 5
        assert node(zk).windows == {NOW: 300} and node(zk).upto == log.visible_offset
    finally:
        log.close()
