"""A log's tally (broker.server.log.tally): the brokers' record counts take what the
append learnt instead of reading it, and must come out exactly as counting by reading
— whatever mix of windows, sets spanning windows, wrappers, Kafka batches, replicated
appends, truncations, restarts, retention and rounds cut short it meets."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker.common.auditcounts import WINDOW_MS, PartitionCounts
from broker.common.kafka.records import check_batch
from broker.common.message import (
    BatchIdentity, batch_identity, encode_batch, encode_message_set, first_entry_size, validate_message_set,
)
from broker.server.audit import RecordCounter
from broker.server.log.lookups import chunks
from broker.server.log.log import Log, LogConfig
from broker.server.log.tally import MAX_RUNS, Tally

NOW = 1_700_000_000_000 - 1_700_000_000_000 % WINDOW_MS
HORIZON_MS = 3 * WINDOW_MS  # the counter keeps three windows back: older ones are pruned


def produce(log: Log, data: bytes) -> None:
    """A leader's append, as the PRODUCE handler makes it (`validate_message_set`)."""
    scanned = validate_message_set(data, 1 << 20)
    batch = batch_identity(data) if scanned.batches else None
    log.append(data, scanned.count, scanned.min_timestamp, scanned.max_timestamp, batch=batch,
               records=scanned.records, times=scanned.record_times)


def kafka_batch(stamps: list[int], codec: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for i, ts in enumerate(stamps):
        builder.append(i, timestamp=ts, key=None, value=b"k%d" % i, headers=[])
    return bytes(builder.build())


@dataclass
class Workload:
    """Random appends of every kind a log takes, in a few windows (one past the horizon)."""

    rng: random.Random
    producer: int = 0
    windows: list[int] = field(default_factory=lambda: [NOW - 5 * WINDOW_MS, NOW - WINDOW_MS, NOW, NOW + WINDOW_MS])

    def stamps(self, n: int) -> list[int]:
        if self.rng.random() < 0.2:  # a set spanning windows
            return [self.rng.choice(self.windows) + self.rng.randrange(WINDOW_MS) for _ in range(n)]
        window = self.rng.choice(self.windows)
        return [window + self.rng.randrange(WINDOW_MS) for _ in range(n)]

    def append(self, log: Log) -> None:
        rng, n = self.rng, self.rng.randint(1, 30)
        records = [(None, b"v" * rng.randint(1, 80), ts) for ts in self.stamps(n)]
        kind = rng.choice(["plain", "plain", "plain", "gzip", "batch", "kafka", "replica"])
        if kind == "plain":
            produce(log, encode_message_set(records))
        elif kind == "gzip":
            produce(log, encode_message_set(records, "gzip"))
        elif kind == "batch":
            self.producer += 1
            produce(log, encode_batch(records, BatchIdentity(self.producer, 0, 0, n)))
        elif kind == "kafka":
            batch = kafka_batch([ts for _, _, ts in records], rng.choice([0, 1]))
            log.append_kafka(batch, check_batch(batch), 0)
        else:  # a follower's append of its leader's bytes
            log.append_replica(encode_message_set(records, rng.choice([None, "gzip"])))


def reference(log: Log, counts: PartitionCounts, visible: int, counter: RecordCounter) -> PartitionCounts:
    """The same round counted by reading only: the log's tally set aside for it."""
    tally, log.tally = log.tally, Tally()
    try:
        return counter._counted(log, counts, visible)
    finally:
        log.tally = tally


def from_runs(log: Log, upto: int, visible: int) -> int:
    """The records a counting round over [upto, visible) takes from the tally."""
    pieces = log.tally.pieces(log.segments, max(upto, log.start_offset), visible, WINDOW_MS)
    return sum(p.records for p in pieces if p.window is not None)


def set_starts(log: Log, start: int) -> list[int]:
    """The entry boundaries of the log past `start` (where a follower may be cut)."""
    out = []
    for offset, data in chunks(log.segments, start, log.end_offset):
        pos = 0
        while pos < len(data):
            out.append(offset + pos)
            pos += first_entry_size(data[pos:])
    return out


@pytest.mark.parametrize("seed", range(12))
def test_counts_with_the_tally_equal_counts_by_reading(tmp_path, seed):
    rng = random.Random(seed)
    config = LogConfig(segment_bytes=rng.choice([2048, 8192, 1 << 20]), retention_bytes=40_000)
    log = Log(tmp_path / "events-0", "events", 0, config)
    counter = RecordCounter(None, HORIZON_MS, 1 << 30, clock=lambda: NOW)  # type: ignore[arg-type]
    tallied = by_reading = PartitionCounts(0, 0)
    work, known = Workload(rng), 0
    try:
        for _ in range(120):
            step = rng.random()
            if step < 0.6:
                work.append(log)
            elif step < 0.75:  # a replicated partition's high watermark, anywhere past what was counted
                log.flush()
                log.high_watermark = rng.choice([log.end_offset, *set_starts(log, tallied.upto)])
            elif step < 0.82:  # a follower cut back (never below what was counted: that is committed)
                cut = [o for o in set_starts(log, max(tallied.upto, log.start_offset)) if o > tallied.upto]
                if cut:
                    log.truncate_to(rng.choice(cut))
            elif step < 0.87:  # a restart: the tally is empty, the log is not
                log.close()
                log = Log(tmp_path / "events-0", "events", 0, config)
                log.high_watermark = None
            elif step < 0.9:
                log.delete_old_segments(NOW)
            else:  # a counting round (several when the reads are bounded), then the reference
                visible = log.visible_offset
                known += from_runs(log, tallied.upto, visible)
                counter.max_bytes = rng.choice([300, 4096, 1 << 30])
                tallied = counter._counted(log, tallied, visible)
                while tallied.upto < visible:  # a bounded round leaves the rest to the next
                    tallied = counter._counted(log, tallied, visible)
                counter.max_bytes = 1 << 30
                by_reading = reference(log, by_reading, visible, counter)
                assert tallied == by_reading
        log.flush()
        log.high_watermark = None
        known += from_runs(log, tallied.upto, log.visible_offset)
        tallied = counter._counted(log, tallied, log.visible_offset)
        assert tallied == reference(log, by_reading, log.visible_offset, counter)
        total = sum(tallied.windows.values()) + tallied.pruned
        assert 0 < known < total  # the runs were used, and so were reads
    finally:
        log.close()


def test_a_follower_that_takes_the_lead_counts_its_runs_exactly(tmp_path):
    """A follower learns its leader's log through `append_replica` (plain sets: runs;
    wrappers: gaps), after a tail it held from an older leader was cut. When it takes
    the lead it continues the counts from where the old leader got, from its own runs,
    and its counts equal counting its whole log by reading."""
    rng = random.Random(7)
    leader = Log(tmp_path / "leader" / "events-0", "events", 0, LogConfig())
    follower = Log(tmp_path / "follower" / "events-0", "events", 0, LogConfig())
    counter = RecordCounter(None, HORIZON_MS, 1 << 30, clock=lambda: NOW)  # type: ignore[arg-type]
    work = Workload(rng)
    try:
        produce(follower, encode_message_set([(None, b"never committed", NOW + 1)] * 9))  # an older leader's
        follower.truncate_to(0)  # KIP-101: cut to where the new leader's log agrees
        assert not follower.tally.runs
        for _ in range(60):
            stamps = work.stamps(rng.randint(1, 20))
            produce(leader, encode_message_set([(None, b"m", ts) for ts in stamps], rng.choice([None, None, "gzip"])))
            for offset, data in chunks(leader.segments, follower.end_offset, leader.end_offset):
                follower.append_replica(data)
        leader.flush()
        leader.high_watermark = follower.high_watermark = set_starts(leader, 0)[200]
        counts = counter._counted(leader, PartitionCounts(0, 0), leader.visible_offset)  # the old leader's rounds
        counted_by_old = sum(counts.windows.values()) + counts.pruned
        follower.flush()
        follower.high_watermark = follower.end_offset  # the new leader's
        known = from_runs(follower, counts.upto, follower.visible_offset)
        counts = counter._counted(follower, counts, follower.visible_offset)
        whole = reference(follower, PartitionCounts(0, 0), follower.visible_offset, counter)
        assert counts == whole
        tail = sum(whole.windows.values()) + whole.pruned - counted_by_old
        assert tail // 3 < known < tail  # its runs counted much of the tail, its reads the wrappers and spanning sets
    finally:
        leader.close()
        follower.close()


def test_a_log_nobody_counts_keeps_a_bounded_tally():
    tally = Tally()
    for i in range(5 * MAX_RUNS):
        tally.note(i, i + 1, 1, (NOW + (i % 2) * WINDOW_MS,) * 2)  # alternating windows: a run per append
    assert MAX_RUNS // 2 <= len(tally.runs) <= MAX_RUNS
    assert tally.runs[-1][1] == 5 * MAX_RUNS
