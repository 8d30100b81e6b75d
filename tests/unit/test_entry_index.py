"""The segments' entry index (broker/server/log/index.py, docs/storage.md "Entry
index"): exact at every position after appends of every kind of set, rolls,
truncation, dropped buffered writes, retention and recovery; its sidecar loaded when it
matches the segment and rebuilt when it is missing, stale or corrupt."""

from __future__ import annotations

import bisect
import errno
import os

import pytest

from broker.common.errors import InvalidRequest
from broker.common.message import BatchIdentity, Codec, append_entry, encode_batch, encode_message_set, iter_messages
from broker.common.records import count_records
from broker.server.log.index import INTERVAL, LONG_SET, load, sidecar_path
from broker.server.log.log import Log, LogConfig


def sets(rounds: int, tag: bytes = b"") -> list[bytes]:
    """Small plain entries, a set of many entries (plain, then a gzip wrapper inside it),
    batches, a zstd set, and values holding encoded entries."""
    fake = encode_message_set([(None, b"a header inside a value", 1)])
    out = []
    for r in range(rounds):
        out += [encode_message_set([(None, tag + b"small-%d-%d" % (r, i), 1)]) for i in range(40)]
        out.append(encode_message_set([(b"k%d" % i, b"long-%d-%d" % (r, i) * 9, 2) for i in range(80)])
                   + encode_message_set([(None, b"gz-%d" % i, 2) for i in range(5)], Codec.GZIP)
                   + encode_message_set([(None, b"after-gz", 2)] * 60))
        out.append(encode_batch([(None, fake, 3)] * 7, BatchIdentity(9, 0, 20 * r, 7)))
        out.append(encode_message_set([(None, b"zstd-%d" % i, 4) for i in range(9)], Codec.ZSTD))
        out.append(encode_message_set([(None, fake * 4, 5)]))
    return out


def fill(log: Log, data_sets: list[bytes], buffered: bool = False) -> None:
    for data in data_sets:
        log.append(data, 1, 1, 1, buffered=buffered, records=count_records(data))
    log.flush()


def truth(log: Log) -> list[int]:
    """Every record's offset, read from the log's bytes at entry boundaries."""
    offsets = []
    for segment in log.segments:
        offsets += [m.offset for m in iter_messages(segment.path.read_bytes(), segment.base_offset)]
    return offsets


def check_exact(log: Log, step: int = 11) -> None:
    """At every `step`-th position: a fetch's set starts at or before the first record
    at or after it (nothing skipped) and holds it; the count below it is exact."""
    offsets = truth(log)
    for offset in range(log.start_offset, log.end_offset, step):
        start, region = log.read_covering(offset, 2048)
        following = bisect.bisect_left(offsets, offset)
        assert start <= offset or bisect.bisect_left(offsets, start) == following, f"records skipped at {offset}"
        got = [m.offset for m in iter_messages(region.read(), start) if m.offset >= offset][:1]
        assert got == offsets[following:][:1], f"fetch at {offset}"
        assert log.record_count(log.start_offset, offset)[0] == following - bisect.bisect_left(offsets, log.start_offset)


@pytest.fixture
def make_log(tmp_path):
    logs = []

    def make(recover: bool = False, **config) -> Log:
        log = Log(tmp_path / "t-0", "t", 0, LogConfig(**{"segment_bytes": 3 * INTERVAL, **config}), recover=recover)
        logs.append(log)
        return log

    yield make
    for log in logs:
        for segment in log.segments:
            segment.close()


def test_every_position_is_resolved_exactly_after_appends_and_rolls(make_log):
    log = make_log()
    fill(log, sets(3))
    assert len(log.segments) >= 3
    index = log.segments[0].index
    assert len(index.positions) >= 2, "a segment longer than the interval has points inside"
    check_exact(log)


def test_a_long_set_gets_points_inside_it_and_a_compressed_entry_stops_them(make_log):
    log = make_log(segment_bytes=1 << 20)
    gzip = encode_message_set([(None, b"gz-%d" % i, 2) for i in range(5)], Codec.GZIP)
    plain = encode_message_set([(b"k%d" % i, b"long-%d" % i * 9, 2) for i in range(400)])
    long_set = plain + gzip + encode_message_set([(None, b"after-gz", 2)] * 300)
    assert len(long_set) > LONG_SET and len(plain) > 4 * INTERVAL
    fill(log, [long_set])
    index = log.segments[0].index
    assert index.positions[0] == 0 and len(index.positions) >= 4
    assert index.records == count_records(long_set)
    assert max(index.positions) < len(plain), "no point after a compressed entry the append did not open"
    check_exact(log, step=7)


def test_sealed_segments_keep_a_sidecar_that_a_clean_start_loads_without_rebuilding(make_log):
    log = make_log()
    fill(log, sets(2))
    sealed = log.segments[0]
    stamp = os.stat(sidecar_path(sealed.path))
    log.close()
    again = make_log()
    assert again.segments[0].slot.index is None, "no index is read at start-up"
    assert again.segments[0].index.records == sealed.index.records
    after = os.stat(sidecar_path(again.segments[0].path))
    assert (after.st_ino, after.st_mtime_ns) == (stamp.st_ino, stamp.st_mtime_ns), "loaded, not rebuilt and rewritten"
    assert sidecar_path(again.segments[-1].path).exists(), "the active segment's too, at the clean close"
    check_exact(again)


@pytest.mark.parametrize("damage", ["missing", "corrupt", "stale", "truncated"])
def test_a_missing_corrupt_or_stale_sidecar_is_ignored_and_rebuilt(make_log, damage):
    log = make_log()
    fill(log, sets(2))
    log.close()
    segment_path = log.segments[0].path
    sidecar = sidecar_path(segment_path)
    good = sidecar.read_bytes()
    if damage == "missing":
        sidecar.unlink()
    elif damage == "corrupt":
        sidecar.write_bytes(good[:40] + bytes([good[40] ^ 0xFF]) + good[41:])
    elif damage == "stale":  # the sidecar of another state of the segment
        stat = os.stat(segment_path)
        os.utime(segment_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    else:
        sidecar.write_bytes(good[: len(good) // 2])
    assert load(segment_path) is None
    again = make_log()
    check_exact(again)
    assert load(segment_path) is not None, "the rebuilt index is saved again"


def test_truncation_cuts_the_index_and_refuses_a_position_inside_an_entry(make_log):
    log = make_log()
    fill(log, sets(2))
    offsets = truth(log)
    batch = sets(1)[41]
    whole = b"".join(s.path.read_bytes() for s in log.segments)
    inner = whole.index(batch) + 40  # the batch's first inner entry: a plausible header inside an entry
    with pytest.raises(InvalidRequest, match="not a message boundary"):
        log.truncate_to(inner)
    middle = offsets[len(offsets) // 2]
    start = log.read_covering(middle, 1)[0]
    log.truncate_to(start)
    assert log.end_offset == start
    assert log.record_count(0) == (bisect.bisect_left(offsets, start), 0, start)
    fill(log, sets(1, tag=b"new-"))
    check_exact(log)


def test_dropped_buffered_sets_leave_the_index(make_log, monkeypatch):
    log = make_log(segment_bytes=1 << 20)
    fill(log, sets(1)[:10])
    kept = log.segments[-1].index.records
    log.append(sets(1)[40], 1, 1, 1, buffered=True, records=count_records(sets(1)[40]))

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    log.write_unwritten()
    monkeypatch.undo()
    assert log.segments[-1].index.records == kept
    log.log_dir._go_online()
    fill(log, sets(1)[10:])
    check_exact(log)


def test_retention_deletes_the_sidecars_and_counts_start_at_the_new_start(make_log):
    log = make_log(retention_bytes=6 * INTERVAL)
    fill(log, sets(3))
    first = log.segments[0]
    removed = log.delete_old_segments(0)
    assert removed and not sidecar_path(first.path).exists()
    offsets = truth(log)
    assert log.record_count(0)[:2] == (len(offsets), log.start_offset)
    check_exact(log)


def test_recovery_rebuilds_the_index_of_a_torn_segment(make_log):
    log = make_log()
    fill(log, sets(2))
    log.flush()
    active = log.segments[-1].path
    for segment in log.segments:
        segment.close()  # a kill -9: no sidecar for the active segment, no clean close
    with open(active, "ab") as file:
        file.write(sets(1)[41][:30])  # a torn write
    sidecar_path(log.segments[0].path).write_bytes(b"garbage")
    again = make_log(recover=True)
    assert again.end_offset == log.end_offset
    check_exact(again)


def test_recovery_counts_a_well_framed_compressed_set_that_cannot_be_opened_as_no_records(make_log):
    """Its CRC is right but its value is not gzip: recovery keeps it (readers skip it,
    docs/protocol.md) and the index neither fails nor counts records nobody can read."""
    log = make_log()
    fill(log, sets(1)[:3])
    bad = bytearray()
    append_entry(bad, b"not gzip at all", None, 1, int(Codec.GZIP), 2)
    for segment in log.segments:
        segment.close()
    with open(log.segments[-1].path, "ab") as file:
        file.write(bytes(bad) + sets(1)[3])
    again = make_log(recover=True)
    assert again.end_offset == log.end_offset + len(bad) + len(sets(1)[3])
    assert again.record_count(0) == (4, 0, again.end_offset)
    bad_at = log.end_offset
    assert again.read_covering(bad_at + 1, 100)[0] == bad_at + len(bad), "past its (no) records: the next entry"


def test_a_follower_copies_and_counts_its_leaders_bytes_even_a_set_no_one_can_open(make_log):
    """A follower counts what it appends (compressed sets opened) but, like recovery,
    never refuses a well-framed entry its leader holds: it counts no records."""
    log = make_log()
    bad = bytearray()
    append_entry(bad, b"not zstd either", None, 1, int(Codec.ZSTD), 2)
    data = b"".join(sets(1)[40:43]) + bytes(bad) + sets(1)[43]
    log.append_replica(data)
    log.flush()
    assert log.end_offset == len(data)
    assert log.record_count(0)[0] == sum(count_records(s) for s in sets(1)[40:44])
    bad_at = len(data) - len(sets(1)[43]) - len(bad)
    assert log.read_covering(bad_at + 1, 100)[0] == bad_at + len(bad), "past its (no) records: the next entry"
