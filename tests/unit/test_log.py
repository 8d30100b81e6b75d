import errno
import os
import threading

import pytest

from broker.common.errors import InvalidRequest, OffsetOutOfRange, StorageError
from broker.common.message import encode_message_set, iter_messages, scan
from broker.server.log.log import Log, LogConfig
from broker.server.log.manager import CLEAN_SHUTDOWN, TOPIC_ID, LogManager, topic_id_of


def append(log: Log, values, ts=1000):
    data = encode_message_set([(None, v, ts + i) for i, v in enumerate(values)])
    result = scan(data)
    return log.append(data, result.count, result.min_timestamp, result.max_timestamp)


def read_all(log: Log, offset=None, max_bytes=1 << 20):
    offset = log.start_offset if offset is None else offset
    values = []
    while offset < log.flushed_offset:
        region = log.read(offset, max_bytes)
        batch = list(iter_messages(region.read(), offset))
        values += [m.value for m in batch]
        offset = batch[-1].next_offset
    return values


@pytest.fixture
def make_log(tmp_path):
    def make(**config):
        return Log(tmp_path / "events-0", "events", 0, LogConfig(**config))

    return make


def test_segments_are_named_by_their_20_digit_base_offset(make_log):
    log = make_log(segment_bytes=1024)
    for i in range(30):
        append(log, [b"x" * 100])
    names = sorted(p.name for p in log.directory.glob("*.kafka"))
    assert names[0] == "00000000000000000000.kafka"
    assert len(names) > 1
    assert all(int(n[:20]) == s.base_offset for n, s in zip(names, log.segments))


def test_segment_rolls_when_it_would_exceed_segment_bytes(make_log):
    log = make_log(segment_bytes=1024)
    for i in range(30):
        append(log, [b"x" * 100])
    assert all(s.size <= 1024 for s in log.segments)
    assert log.segments[1].base_offset == log.segments[0].end_offset


def test_segment_rolls_by_age(make_log):
    log = make_log(roll_ms=1)
    append(log, [b"a"])
    log._rolled_at -= 1  # the segment is now a second old
    append(log, [b"b"])
    assert len(log.segments) == 2


def test_reads_cross_segment_boundaries(make_log):
    log = make_log(segment_bytes=1024)
    values = [b"%03d" % i * 30 for i in range(40)]
    for v in values:
        append(log, [v])
    log.flush()
    assert len(log.segments) > 2
    assert read_all(log, max_bytes=300) == values


def test_unflushed_data_is_invisible(make_log):
    log = make_log()
    append(log, [b"one", b"two"])
    assert log.flushed_offset == 0
    assert log.read(0, 1000).length == 0
    log.flush()
    assert read_all(log) == [b"one", b"two"]


def test_read_at_end_is_empty_and_past_end_is_out_of_range(make_log):
    log = make_log()
    result = append(log, [b"x"])
    log.flush()
    assert log.read(result.next_offset, 100).length == 0
    with pytest.raises(OffsetOutOfRange, match="outside the range"):
        log.read(result.next_offset + 1, 100)
    with pytest.raises(OffsetOutOfRange):
        log.read(-5, 100)


def test_read_is_capped_at_max_bytes_and_may_end_mid_message(make_log):
    log = make_log()
    append(log, [b"x" * 100, b"y" * 100])
    log.flush()
    region = log.read(0, 150)
    assert region.length == 150
    assert [m.value for m in iter_messages(region.read(), 0)] == [b"x" * 100]


def test_flush_policy_by_message_count(make_log):
    log = make_log(flush_interval_messages=3, flush_interval_ms=10**9)
    append(log, [b"a", b"b"])
    assert not log.flush_due()
    append(log, [b"c"])
    assert log.flush_due()


def test_offsets_before_time(make_log):
    log = make_log(segment_bytes=1024)
    for i in range(30):
        append(log, [b"x" * 100], ts=10_000 + i * 1000)
    log.flush()
    bases = [s.base_offset for s in log.segments]
    assert log.offsets_before(-2) == [0]
    assert log.offsets_before(-1) == [log.flushed_offset]
    # a time inside the second segment: its start first, then the first segment's
    t = log.segments[1].min_timestamp + 1
    assert log.offsets_before(t, 10) == [bases[1], bases[0]]
    assert log.offsets_before(10**12, 1) == [log.flushed_offset]
    assert log.offsets_before(5, 10) == []


def test_recovery_truncates_garbage_tail(make_log):
    log = make_log()
    append(log, [b"good-1", b"good-2"])
    log.flush()
    end = log.end_offset
    path = log.segments[-1].path
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x00\x30" + os.urandom(20))  # a plausible size, then junk
    reopened = Log(log.directory, "events", 0, log.config, recover=True)
    assert reopened.end_offset == end
    assert path.stat().st_size == end
    assert read_all(reopened) == [b"good-1", b"good-2"]


def test_recovery_truncates_torn_last_entry(make_log):
    log = make_log()
    append(log, [b"a" * 50, b"b" * 50, b"c" * 50])
    log.flush()
    path = log.segments[-1].path
    os.truncate(path, path.stat().st_size - 10)
    reopened = Log(log.directory, "events", 0, log.config, recover=True)
    assert read_all(reopened) == [b"a" * 50, b"b" * 50]
    assert reopened.end_offset == 2 * (50 + 22)


def test_recovery_of_a_torn_middle_segment_drops_what_follows_the_hole(make_log):
    log = make_log(segment_bytes=1024)
    for i in range(30):
        append(log, [b"x" * 100])
    log.close()
    first = log.segments[0]
    os.truncate(first.path, first.size - 5)
    first.meta_path.unlink()
    reopened = Log(log.directory, "events", 0, log.config, recover=True)
    assert len(reopened.segments) == 1
    assert reopened.end_offset == first.size - 5 - (first.size - 5) % 122  # last whole message
    assert len(read_all(reopened)) == (first.size - 5) // 122


def test_retention_by_time_uses_largest_message_timestamp(make_log):
    log = make_log(segment_bytes=1024, retention_ms=60_000)
    for i in range(20):
        append(log, [b"x" * 100], ts=1_000 + i)  # ancient
    for i in range(20):
        append(log, [b"y" * 100], ts=10_000_000 + i)
    log.flush()
    end = log.end_offset
    deleted = log.delete_old_segments(now_ms=10_000_000 + 30_000)
    assert deleted and all(s.max_timestamp < 1_100 for s in deleted)
    assert log.start_offset > 0
    assert log.end_offset == end  # offsets keep growing; nothing renumbered
    assert all(not s.path.exists() for s in deleted)


def test_retention_by_size_keeps_the_active_segment(make_log):
    log = make_log(segment_bytes=1024, retention_bytes=2048, retention_ms=-1)
    for i in range(40):
        append(log, [b"x" * 100])
    log.flush()
    log.delete_old_segments(now_ms=0)
    assert log.size <= 2048 + 1024
    assert len(log.segments) >= 1
    assert log.segments[-1].end_offset == log.end_offset


def test_retention_while_a_reader_reads(make_log):
    """A reader racing retention gets whole, valid messages or OffsetOutOfRange — never garbage."""
    log = make_log(segment_bytes=2048, retention_bytes=4096, retention_ms=-1)
    stop = threading.Event()
    problems = []
    read_count = [0]

    def reader():
        offset = 0
        while not stop.is_set():
            try:
                region = log.read(offset, 1000)
                batch = list(iter_messages(region.read(), offset))
            except OffsetOutOfRange:
                offset = log.start_offset
                continue
            except Exception as exc:  # anything else is a bug
                problems.append(exc)
                return
            if batch:
                read_count[0] += len(batch)
                offset = batch[-1].next_offset

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(300):
            append(log, [b"%05d" % i * 20])
            log.flush()
            if i % 10 == 0:
                log.delete_old_segments(now_ms=0)
    finally:
        stop.set()
        thread.join(30)
    assert problems == []
    assert read_count[0] > 0
    assert log.start_offset > 0


def test_a_read_of_a_segment_retention_just_deleted_is_out_of_range_and_leaves_no_file(make_log):
    """The reader took the segment list before retention deleted its segment (the race
    of the test above, made certain): reopening the dropped file must not create an
    empty one in its place, whose missing header read as 'not a message boundary'."""
    log = make_log(segment_bytes=2048, retention_bytes=4096, retention_ms=-1)
    for i in range(60):
        append(log, [b"%05d" % i * 20])
    log.flush()
    first = log.segments[0]
    stale_view = log._view  # what a reader holds
    log.delete_old_segments(now_ms=0)
    assert not first.path.exists(), "retention must have deleted the first segment"
    log._view = stale_view
    with pytest.raises(OffsetOutOfRange):
        log.read(first.base_offset + 122, 1000)  # the second entry of the deleted segment
    assert not first.path.exists(), "the read made an empty file where the segment was"


def test_a_flush_racing_retention_skips_the_segments_retention_deleted(make_log):
    """The flush lists its dirty segments, then retention deletes some before their
    fsync (the race, made certain): their bytes need no durability any more, so the
    flush must finish and move the flushed offset, not fail the log directory."""
    log = make_log(segment_bytes=2048, retention_bytes=4096, retention_ms=-1)
    for i in range(60):
        append(log, [b"%05d" % i * 20])
    first = log.segments[0]
    fsync = first.fsync

    def fsync_then_retention() -> None:
        fsync()
        log.delete_old_segments(now_ms=0)

    first.fsync = fsync_then_retention
    assert log.flush() == log.end_offset
    assert log.start_offset > first.end_offset, "retention must have deleted segments the flush listed"
    assert log.flushed_offset == log.end_offset


def test_manager_places_new_partitions_in_the_least_loaded_dir(tmp_path):
    dirs = (tmp_path / "a", tmp_path / "b")
    manager = LogManager(dirs, LogConfig())
    manager.load()
    for p in range(4):
        manager.get_or_create("t", p)
    counts = [len(list(d.iterdir())) for d in dirs]
    assert counts == [2, 2]


def test_manager_marks_clean_shutdown_and_skips_recovery(tmp_path):
    manager = LogManager((tmp_path,), LogConfig())
    manager.load()
    log = manager.get_or_create("t", 0)
    append(log, [b"x"])
    manager.close()
    assert (tmp_path / CLEAN_SHUTDOWN).exists()
    again = LogManager((tmp_path,), LogConfig())
    again.load()
    assert not (tmp_path / CLEAN_SHUTDOWN).exists()  # a crash from now on means recovery
    assert again.get("t", 0).end_offset == log.end_offset


def test_buffered_appends_reach_the_file_in_one_write_and_before_any_flush(make_log):
    log = make_log()
    data = encode_message_set([(None, b"buffered", 1)])
    for _ in range(3):
        log.append(data, 1, 1, 1, buffered=True)
    path = log.segments[-1].path
    assert path.stat().st_size == 0  # still in the broker's buffer
    assert log.end_offset == 3 * len(data)  # but offsets are assigned
    log.write_unwritten()
    assert path.stat().st_size == 3 * len(data)
    log.append(data, 1, 1, 1, buffered=True)
    log.flush()  # a flush writes the buffer before its fsync
    assert path.stat().st_size == 4 * len(data)
    assert read_all(log) == [b"buffered"] * 4


def test_an_acknowledged_append_after_buffered_ones_keeps_their_order(make_log):
    log = make_log()
    first = encode_message_set([(None, b"acks=0", 1)])
    second = encode_message_set([(None, b"acks=1", 2)])
    log.append(first, 1, 1, 1, buffered=True)
    log.append(second, 1, 2, 2)  # unbuffered: written now, behind the buffered set
    assert log.segments[-1].path.read_bytes() == first + second


# ------------------------------------------------------------------ failed writes


def _failing_write(monkeypatch, fail_after: int, err: int = errno.ENOSPC):
    """os.write that takes `fail_after` bytes (a short write), then fails like a full disk."""
    real_write = os.write
    state = {"left": fail_after}

    def write(fd, data):
        if state["left"] <= 0:
            raise OSError(err, os.strerror(err))
        n = real_write(fd, bytes(data[: state["left"]]))
        state["left"] -= n
        return n

    monkeypatch.setattr(os, "write", write)


def test_failed_append_leaves_segment_and_end_unchanged(make_log, monkeypatch):
    log = make_log()
    append(log, [b"kept"])
    end, path = log.end_offset, log.segments[-1].path
    _failing_write(monkeypatch, fail_after=10)  # a torn entry would be 10 bytes
    with pytest.raises(StorageError, match="No space left"):
        append(log, [b"y" * 100])
    assert log.end_offset == end
    assert path.stat().st_size == end  # the partial write was cut off


def test_full_disk_takes_the_log_dir_offline_until_a_probe_passes(make_log, monkeypatch):
    log = make_log()
    _failing_write(monkeypatch, fail_after=0)
    with pytest.raises(StorageError):
        append(log, [b"x"])
    monkeypatch.undo()
    assert not log.log_dir.online
    with pytest.raises(StorageError, match="offline"):  # refused without a write attempt
        append(log, [b"x"])
    log.log_dir.min_free_bytes = 0
    assert log.log_dir.probe()
    log.log_dir._go_online()
    result = append(log, [b"after"])
    log.flush()
    assert result.base_offset == 0
    assert read_all(log) == [b"after"]


def test_probe_thread_puts_the_dir_back_online(tmp_path, monkeypatch):
    from harness.process import wait_until

    log = Log(tmp_path / "events-0", "events", 0, LogConfig(dir_probe_interval_ms=20, dir_min_free_bytes=0))
    log.log_dir.go_offline("test")
    wait_until(lambda: log.log_dir.online, 10, "the probe to put the directory online")
    append(log, [b"x"])


def test_failed_fsync_does_not_advance_the_flushed_offset(make_log, monkeypatch):
    log = make_log()
    append(log, [b"a"])

    def fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StorageError, match="fsync failed"):
        log.flush()
    assert log.flushed_offset == 0
    assert not log.log_dir.online


def test_failed_buffered_write_is_dropped_not_raised(make_log, monkeypatch):
    log = make_log()
    append(log, [b"a"])
    end = log.end_offset
    data = encode_message_set([(None, b"b", 1)])
    log.append(data, 1, 1, 1, buffered=True)
    _failing_write(monkeypatch, fail_after=5)
    log.write_unwritten()  # acks=0 data: logged by the log dir, not raised
    assert log.end_offset == end
    assert log.segments[-1].path.stat().st_size == end


def test_failed_cut_back_is_retried_before_the_next_write(make_log, monkeypatch):
    log = make_log()
    append(log, [b"a"])
    end = log.end_offset
    real_ftruncate = os.ftruncate
    _failing_write(monkeypatch, fail_after=7)
    monkeypatch.setattr(os, "ftruncate", lambda fd, n: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")))
    with pytest.raises(StorageError):
        append(log, [b"b" * 50])
    assert log.segments[-1].path.stat().st_size == end + 7  # the stray tail is still there
    monkeypatch.setattr(os, "write", _real_write)
    monkeypatch.setattr(os, "ftruncate", real_ftruncate)
    log.log_dir._go_online()
    result = append(log, [b"c"])
    assert result.base_offset == end
    log.flush()
    assert read_all(log) == [b"a", b"c"]


_real_write = os.write


# ------------------------------------------------------------------ boundaries, files


def test_fetch_inside_a_message_is_an_invalid_request(make_log):
    log = make_log()
    append(log, [b"x" * 100, b"y" * 100])
    log.flush()
    with pytest.raises(InvalidRequest, match="not a message boundary"):
        log.read(7, 1000)
    assert log.read(122, 1000).length == 122  # the second message's offset


def test_open_segment_files_are_bounded(tmp_path):
    manager = LogManager((tmp_path,), LogConfig(open_files_max=4, segment_bytes=1024))
    logs = [manager.get_or_create("t", p) for p in range(12)]
    for round_ in range(3):
        for log in logs:
            append(log, [b"%d" % round_ * 300])
    for log in logs:
        log.flush()
        assert read_all(log) == [b"0" * 300, b"1" * 300, b"2" * 300]
    assert len(manager.files) <= 4
    manager.close()


def test_loading_opens_no_segment_file(tmp_path):
    manager = LogManager((tmp_path,), LogConfig())
    for p in range(20):
        append(manager.get_or_create("t", p), [b"x"])
    manager.close()
    again = LogManager((tmp_path,), LogConfig())
    again.load()
    assert again.files.opened == 0
    assert len(list(again)) == 20
    again.close()


def test_a_partition_directory_without_a_topic_id_takes_the_topics_and_one_of_another_id_goes(tmp_path):
    """A directory from before topic ids (a broker from before them, as in a rolling
    upgrade) was taken for an older incarnation and removed: a one-replica partition's
    data lost. It takes the id; a directory of another id is a deletion missed, removed."""
    manager = LogManager((tmp_path,), LogConfig())
    manager.load()
    old = manager.get_or_create("t", 0)
    append(old, [b"kept"])
    other = manager.get_or_create("t", 1)
    (other.directory / TOPIC_ID).write_text("an-older-incarnation")
    removed = manager.adopt("t", "the-current-id")
    assert [log.partition for log in removed] == [1]
    assert manager.get("t", 0) is old and manager.get("t", 1) is None
    assert topic_id_of(old) == "the-current-id" and old.end_offset > 0


def test_adopting_a_topic_waits_for_a_partition_being_created_and_keeps_it(tmp_path):
    """The broker creates a partition (a leadership change) while another thread adopts
    the topic's id (the assignment's watch). Read while `get_or_create` was writing the
    new directory's id, the file was empty, so adopt removed the log under its leader:
    every append then failed with StorageError (seen in CI, test_acknowledgements).
    Adopt must wait for the creation and keep the log."""
    manager = LogManager((tmp_path,), LogConfig())
    manager.load()
    writing, adopted = threading.Event(), threading.Event()

    def topic_id_being_written(topic: str) -> str:
        writing.set()  # the log exists, its id not yet written
        adopted.wait(2)  # adopt (old code: runs now, reads no id, writes it; would see a torn one)
        return "the-current-id"

    manager.topic_id_of = topic_id_being_written
    creator = threading.Thread(target=manager.get_or_create, args=("t", 0))
    creator.start()
    assert writing.wait(10)
    adopter = threading.Thread(target=lambda: (manager.adopt("t", "the-current-id"), adopted.set()))
    adopter.start()
    adopter.join(1)
    assert adopter.is_alive(), "adopt must wait for the partition being created"
    creator.join(10)
    adopter.join(10)
    assert manager.get("t", 0) is not None and topic_id_of(manager.get("t", 0)) == "the-current-id"
