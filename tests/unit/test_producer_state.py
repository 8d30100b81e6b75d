"""Producer state (docs/storage.md, "Producer state"): a retried batch is answered with
its first append's offsets, out-of-order and fenced batches are refused with nothing
appended, and the state survives what the log survives — clean and unclean restarts,
snapshots, truncation, replication — and expires by the broker's clock of each id's
last append, whatever its messages' timestamps (issue 33)."""

import json
import time
import zlib

import pytest

from broker.common.errors import DuplicateSequence, InvalidProducerEpoch, OutOfOrderSequence
from broker.common.message import BatchIdentity, encode_batch, encode_message_set, iter_messages, now_ms, scan
from broker.server.log.log import Log, LogConfig
from broker.server.log.producers import ProducerState, snapshot_path

HOUR_MS = 3600 * 1000
DAY_MS = 24 * HOUR_MS  # producer.id.expiration.ms's default


class Clock:
    """The broker's clock, moved by the test instead of sleeping."""

    def __init__(self) -> None:
        self.ms = now_ms()

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> None:
        self.ms += ms


def produce(log: Log, identity: BatchIdentity, value: bytes = b"v", timestamp: int | None = None):
    ts = int(time.time() * 1000) if timestamp is None else timestamp
    data = encode_batch([(None, value + b"-%d" % i, ts) for i in range(identity.count)], identity)
    result = scan(data)
    return log.append(data, result.count, result.min_timestamp, result.max_timestamp, batch=identity)


def values(log: Log) -> list[bytes]:
    log.flush()
    out, offset = [], log.start_offset
    while offset < log.end_offset:
        messages = list(iter_messages(log.read(offset, 1 << 30).read(), offset))
        out += [m.value for m in messages]
        offset = messages[-1].next_offset
    return out


@pytest.fixture
def make_log(tmp_path):
    def make(recover: bool = False, clock=now_ms, **config):
        return Log(tmp_path / "events-0", "events", 0, LogConfig(**config), recover=recover, clock=clock)
    return make


P = 9_000_000_123


def test_a_retried_batch_is_answered_with_its_first_offsets_and_not_appended(make_log):
    log = make_log()
    first = produce(log, BatchIdentity(P, 0, 0, 3))
    second = produce(log, BatchIdentity(P, 0, 3, 2))
    retry = produce(log, BatchIdentity(P, 0, 0, 3))
    assert retry.duplicate and (retry.base_offset, retry.next_offset) == (first.base_offset, first.next_offset)
    assert produce(log, BatchIdentity(P, 0, 3, 2)).base_offset == second.base_offset
    assert len(values(log)) == 5


def test_a_batch_older_than_the_last_five_is_a_duplicate_without_offsets(make_log):
    log = make_log()
    for i in range(8):
        produce(log, BatchIdentity(P, 0, 2 * i, 2))
    end = log.end_offset
    with pytest.raises(DuplicateSequence, match="sequences 2..3 were appended"):
        produce(log, BatchIdentity(P, 0, 2, 2))
    with pytest.raises(OutOfOrderSequence):  # overlaps the newest batch and goes past it: not a repeat
        produce(log, BatchIdentity(P, 0, 15, 3))
    assert log.end_offset == end


@pytest.mark.parametrize("restart", [None, "clean", "kill"])
def test_a_batch_before_the_first_held_of_an_unknown_producer_is_out_of_order_not_a_duplicate(make_log, restart):
    """Found by CI: a new producer's first batches to a partition were refused (its broker
    did not know the topic yet) while its later ones, in flight behind them, were appended
    — an unknown id may start at any sequence. The retries of the first were then taken
    for batches "appended before its last 5" and answered as duplicates: 150 messages
    lost, the producer told they were delivered."""
    log = make_log(segment_bytes=300)
    for seq in (150, 200):
        produce(log, BatchIdentity(P, 0, seq, 50))
    if restart == "clean":
        log.close()
    elif restart == "kill":
        log.flush()
    if restart:
        log = make_log(recover=restart == "kill", segment_bytes=300)
    end = log.end_offset
    with pytest.raises(OutOfOrderSequence, match="before 150, the first this partition holds"):
        produce(log, BatchIdentity(P, 0, 0, 50))
    assert log.end_offset == end
    assert produce(log, BatchIdentity(P, 0, 200, 50)).duplicate  # held from 150 on: a true repeat


def test_a_gap_or_an_old_epoch_is_refused_and_nothing_appended(make_log):
    log = make_log()
    produce(log, BatchIdentity(P, 1, 0, 2))
    end = log.end_offset
    with pytest.raises(OutOfOrderSequence, match="expected sequence 2, got 4"):
        produce(log, BatchIdentity(P, 1, 4, 1))
    with pytest.raises(InvalidProducerEpoch, match="fenced"):
        produce(log, BatchIdentity(P, 0, 2, 1))
    with pytest.raises(OutOfOrderSequence, match="must start at sequence 0"):
        produce(log, BatchIdentity(P, 2, 5, 1))
    assert log.end_offset == end
    assert not produce(log, BatchIdentity(P, 2, 0, 1)).duplicate  # a new epoch starts at 0


def test_an_unknown_or_expired_producer_starts_afresh(make_log):
    clock = Clock()
    log = make_log(producer_id_expiration_ms=60_000, clock=clock)
    produce(log, BatchIdentity(P + 1, 0, 0, 1))
    clock.advance(120_000)
    assert not produce(log, BatchIdentity(P, 0, 17, 1)).duplicate  # unknown: any sequence
    log.delete_old_segments(clock())  # the retention pass also expires ids
    assert P + 1 not in log.producers.entries and P in log.producers.entries
    assert not produce(log, BatchIdentity(P + 1, 0, 9, 1)).duplicate


def test_an_id_idle_past_the_expiration_by_the_brokers_clock_is_forgotten(make_log):
    clock = Clock()
    log = make_log(clock=clock)
    produce(log, BatchIdentity(P, 0, 0, 2), timestamp=clock() + HOUR_MS)  # events stamped in the future
    clock.advance(DAY_MS)
    log.delete_old_segments(clock())
    assert produce(log, BatchIdentity(P, 0, 0, 2)).duplicate  # idle exactly the expiration: kept
    produce(log, BatchIdentity(P + 1, 0, 0, 1))  # another id's append does not refresh P
    clock.advance(1)
    log.delete_old_segments(clock())
    assert P not in log.producers.entries and P + 1 in log.producers.entries
    assert not produce(log, BatchIdentity(P, 0, 0, 2)).duplicate  # starts afresh: stored again


def test_old_event_timestamps_with_a_recent_append_are_kept(make_log):
    """Issue 33: a batch of events stamped 30 h ago was forgotten at the next retention
    pass, one day (producer.id.expiration.ms) being measured on its timestamps."""
    clock = Clock()
    log = make_log(clock=clock)
    first = produce(log, BatchIdentity(P, 0, 0, 2), timestamp=clock() - 30 * HOUR_MS)
    clock.advance(DAY_MS - HOUR_MS)
    log.delete_old_segments(clock())
    retry = produce(log, BatchIdentity(P, 0, 0, 2))
    assert retry.duplicate and retry.base_offset == first.base_offset
    assert len(values(log)) == 2


def test_a_snapshot_keeps_the_clock_of_the_last_append(make_log):
    """A clean restart 20 h after the append: the id has 4 h left, not a fresh day."""
    clock = Clock()
    log = make_log(clock=clock)
    produce(log, BatchIdentity(P, 0, 0, 1), timestamp=clock() - 30 * HOUR_MS)
    clock.advance(20 * HOUR_MS)
    log.close()  # the snapshot at the end: no scan at the next start
    again = make_log(clock=clock)
    clock.advance(4 * HOUR_MS)
    again.delete_old_segments(clock())
    assert produce(again, BatchIdentity(P, 0, 0, 1)).duplicate
    clock.advance(1)
    again.delete_old_segments(clock())
    assert P not in again.producers.entries


def test_recovery_counts_the_bytes_after_the_snapshot_as_appended_when_it_scans_them(make_log):
    """kill -9 (no snapshot at the end): the scanned batch's append time is unknown, so
    the time of the scan stands in — later than the real append, never earlier."""
    clock = Clock()
    log = make_log(clock=clock)
    produce(log, BatchIdentity(P, 0, 0, 1), timestamp=clock() - 30 * HOUR_MS)
    log.flush()
    clock.advance(20 * HOUR_MS)
    again = make_log(recover=True, clock=clock)
    clock.advance(DAY_MS)
    again.delete_old_segments(clock())
    assert produce(again, BatchIdentity(P, 0, 0, 1)).duplicate
    clock.advance(1)
    again.delete_old_segments(clock())
    assert P not in again.producers.entries


@pytest.mark.parametrize("event_hours", [-30, 10])
def test_an_old_format_snapshot_is_forgotten_no_earlier_than_before(make_log, event_hours):
    """A snapshot of a broker before issue 33 holds each id's largest message timestamp,
    no append time: the id counts as appended when the snapshot is loaded, or at that
    timestamp if later — never forgotten before the old broker would have."""
    clock = Clock()
    log = make_log(clock=clock)
    stamped = clock() + event_hours * HOUR_MS
    first = produce(log, BatchIdentity(P, 3, 0, 2), timestamp=stamped)
    log.close()
    body = json.dumps({"offset": first.next_offset, "producers": {str(P): {
        "epoch": 3, "last_timestamp": stamped, "batches": [[0, 1, first.base_offset, first.next_offset]]}}}).encode()
    snapshot_path(log.directory, first.next_offset).write_bytes(b"%08x\n" % zlib.crc32(body) + body)
    clock.advance(HOUR_MS)
    again = make_log(clock=clock)
    forgotten_at = max(clock(), stamped) + DAY_MS
    clock.ms = forgotten_at
    again.delete_old_segments(clock())
    retry = produce(again, BatchIdentity(P, 3, 0, 2))
    assert retry.duplicate and retry.base_offset == first.base_offset
    clock.advance(1)
    again.delete_old_segments(clock())
    assert P not in again.producers.entries


@pytest.mark.parametrize("clean", [True, False])
def test_a_retry_after_a_restart_is_still_a_duplicate(make_log, clean):
    log = make_log(segment_bytes=300)
    batches = [BatchIdentity(P, 0, 2 * i, 2) for i in range(10)]  # several segments
    first = [produce(log, b) for b in batches]
    if clean:
        log.close()
    else:
        log.flush()  # kill -9: no close, no snapshot at the end
    again = make_log(recover=not clean, segment_bytes=300)
    retry = produce(again, batches[-1])
    assert retry.duplicate and retry.base_offset == first[-1].base_offset
    assert len(values(again)) == 20


def test_recovery_scans_only_from_the_newest_snapshot(make_log, monkeypatch):
    log = make_log(segment_bytes=300)
    for i in range(10):
        produce(log, BatchIdentity(P, 0, i, 1))
    snapshots = log.producer_snapshots
    assert len(snapshots) >= 2 and snapshots[-1] <= log.end_offset
    log.flush()
    scanned = []
    original = ProducerState.learn
    monkeypatch.setattr(ProducerState, "learn", lambda self, data, base: (scanned.append(base), original(self, data, base)))
    again = make_log(recover=True, segment_bytes=300)
    assert scanned and min(scanned) >= snapshots[-1]
    assert produce(again, BatchIdentity(P, 0, 9, 1)).duplicate


def test_truncation_forgets_the_batches_it_removes(make_log):
    log = make_log(segment_bytes=300)
    for i in range(6):
        produce(log, BatchIdentity(P, 0, i, 1))
    cut = produce(log, BatchIdentity(P, 0, 6, 1)).base_offset
    produce(log, BatchIdentity(P, 0, 7, 1))
    log.truncate_to(cut)
    assert not produce(log, BatchIdentity(P, 0, 6, 1)).duplicate  # appended again: the log lost it
    assert produce(log, BatchIdentity(P, 0, 5, 1)).duplicate  # still held
    assert all(o <= log.end_offset for o in log.producer_snapshots)


def test_a_follower_counts_an_id_idle_from_its_own_append(make_log, tmp_path):
    """The follower replicated the batch 5 h after the leader appended it: once leader,
    it keeps the id 5 h longer than the old leader would have, never shorter."""
    clock = Clock()
    leader = make_log(clock=clock)
    first = produce(leader, BatchIdentity(P, 0, 0, 2), timestamp=clock() - 30 * HOUR_MS)
    leader.flush()
    clock.advance(5 * HOUR_MS)
    follower = Log(tmp_path / "replica" / "events-0", "events", 0, LogConfig(), clock=clock)
    follower.append_replica(leader.read(0, 1 << 20, upto=leader.end_offset).read())
    clock.advance(DAY_MS - HOUR_MS)
    for log in (leader, follower):
        log.delete_old_segments(clock())
    assert P not in leader.producers.entries
    retry = produce(follower, BatchIdentity(P, 0, 0, 2))  # the follower, now leader, gets the retry
    assert retry.duplicate and retry.base_offset == first.base_offset


def test_a_follower_learns_the_state_from_the_bytes_it_replicates(make_log, tmp_path):
    leader = make_log()
    first = produce(leader, BatchIdentity(P, 0, 0, 4))
    leader.flush()
    follower = Log(tmp_path / "replica" / "events-0", "events", 0, LogConfig())
    follower.append_replica(leader.read(0, 1 << 20, upto=leader.end_offset).read())
    retry = produce(follower, BatchIdentity(P, 0, 0, 4))  # the follower, now leader, gets the retry
    assert retry.duplicate and retry.base_offset == first.base_offset


def test_old_format_entries_recover_next_to_batches(make_log):
    log = make_log()
    plain = encode_message_set([(None, b"old", 1)])
    log.append(plain, 1, 1, 1)
    produce(log, BatchIdentity(P, 0, 0, 2))
    log.append(plain, 1, 1, 1)
    log.flush()
    again = make_log(recover=True)
    assert values(again) == [b"old", b"v-0", b"v-1", b"old"]
    assert produce(again, BatchIdentity(P, 0, 0, 2)).duplicate
