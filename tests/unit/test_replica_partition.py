"""A leader's book-keeping of one replicated partition (broker/server/replication/partition.py)
on a real log: the high watermark over the ISR, who may join, who lags, acks=-1."""

import asyncio
import threading

import pytest

from broker.common.errors import NotEnoughReplicasAfterAppend, NotLeaderForPartition, RequestTimedOut
from broker.common.zklayout import PartitionState
from broker.server.log.log import Log, LogConfig
from broker.server.log.scheduler import FlushScheduler
from broker.server.replication.partition import Partition
from tests.unit.test_log import append


def leader(tmp_path, isr=(0, 1, 2), min_insync=1) -> Partition:
    log = Log(tmp_path / "t-0", "t", 0, LogConfig())
    log.high_watermark = 0
    part = Partition(log, 0, [0, 1, 2], FlushScheduler(1).flusher(log), min_insync)
    part.become_leader(PartitionState(0, 3, list(isr)), 0)
    return part


def test_high_watermark_is_the_smallest_flushed_end_over_the_isr_and_never_goes_back(tmp_path):
    async def run():
        part = leader(tmp_path)
        end = append(part.log, [b"a", b"b"]).next_offset
        part.log.flush()
        part.record_fetch(1, end, end)
        assert part.high_watermark == 0  # follower 2 has nothing yet
        part.record_fetch(2, end, 10)
        assert part.high_watermark == 10  # fetched all, flushed 10
        part.record_fetch(2, end, end)
        assert part.high_watermark == end
        part.record_fetch(1, 0, 0)  # a follower that went back (truncated) does not move it back
        assert part.high_watermark == end
        assert part.log.epochs.entries == [(3, 0)]

    asyncio.run(run())


def test_only_a_caught_up_follower_with_the_hw_on_disk_may_join(tmp_path):
    async def run():
        part = leader(tmp_path, isr=(0, 1))
        end = append(part.log, [b"a"]).next_offset
        part.log.flush()
        part.record_fetch(1, end, end)
        assert part.high_watermark == end
        assert not part.record_fetch(2, 0, 0)  # behind
        assert not part.record_fetch(2, end, 0)  # caught up, but the HW is not on its disk
        assert part.record_fetch(2, end, end)
        assert not part.record_fetch(1, end, end)  # already in

    asyncio.run(run())


def test_followers_that_stop_fetching_lag(tmp_path):
    async def run():
        part = leader(tmp_path)
        await asyncio.sleep(0.01)
        part.record_fetch(1, part.log.end_offset, 0)
        assert part.lagging(0.005) == [2]

    asyncio.run(run())


def test_acks_all_waits_for_the_hw_or_times_out(tmp_path):
    async def run():
        part = leader(tmp_path, isr=(0, 1))
        end = append(part.log, [b"a"]).next_offset
        waiting = asyncio.ensure_future(part.wait_committed(end, 3, 10_000))
        await asyncio.sleep(0.05)  # the leader flushes
        assert not waiting.done()
        part.record_fetch(1, end, end)
        await waiting
        later = append(part.log, [b"b"]).next_offset
        with pytest.raises(RequestTimedOut):
            await part.wait_committed(later, 3, 50)

    asyncio.run(run())


def test_an_isr_below_min_insync_fails_the_waiters(tmp_path):
    async def run():
        part = leader(tmp_path, isr=(0, 1), min_insync=2)
        end = append(part.log, [b"a"]).next_offset
        waiting = asyncio.ensure_future(part.wait_committed(end, 3, 10_000))
        await asyncio.sleep(0)
        part.update_isr(PartitionState(0, 3, [0]), 1)
        with pytest.raises(NotEnoughReplicasAfterAppend):
            await waiting

    asyncio.run(run())


def test_a_joining_follower_counts_for_the_hw_before_its_isr_write_is_applied(tmp_path):
    """Once the larger ISR is in ZooKeeper the controller may elect the joining
    follower: an acks=-1 answer must not rest on the smaller ISR meanwhile (found by the
    history checker, seed 12: a leader paused between the write and its result lost an
    acknowledged message)."""
    async def run():
        part = leader(tmp_path, isr=(0,))
        end = append(part.log, [b"a"]).next_offset
        part.log.flush()
        part.update_high_watermark()
        assert part.high_watermark == end
        assert part.record_fetch(1, end, end)  # caught up: the broker writes isr [0, 1]
        part.joining = 1
        more = append(part.log, [b"b"]).next_offset
        part.log.flush()
        part.update_high_watermark()
        assert part.high_watermark == end  # not `more`: follower 1 does not have it yet
        part.record_fetch(1, more, more)
        assert part.high_watermark == more

    asyncio.run(run())


def test_by_default_the_high_watermark_waits_for_the_followers_disks_not_the_leaders(tmp_path):
    """`replica.visibility=followers-flushed` (issue 25): once every in-sync follower has
    flushed a message it is committed and visible, whatever the leader's flush policy
    (an hour here); with no follower in the ISR the leader's own flush decides, so an
    acknowledged write is always on some disk."""
    async def run():
        log = Log(tmp_path / "t-0", "t", 0, LogConfig(flush_interval_ms=3_600_000))
        log.high_watermark = 0
        part = Partition(log, 0, [0, 1], FlushScheduler(1).flusher(log), 1)
        part.become_leader(PartitionState(0, 1, [0, 1]), 0)
        end = append(log, [b"first"]).next_offset
        waiting = asyncio.ensure_future(part.wait_committed(end, 1, 0))
        part.record_fetch(1, end, end)
        await asyncio.wait_for(waiting, 30)
        assert part.high_watermark == log.visible_offset == end and log.flushed_offset == 0
        assert log.read(0, 1000).length == end  # consumers read it from the page cache
        part.update_isr(PartitionState(0, 1, [0]), 1)  # the follower drops out
        second = append(log, [b"second"]).next_offset
        waiting = asyncio.ensure_future(part.wait_committed(second, 1, 0))
        await asyncio.wait_for(waiting, 30)  # answered by the leader's flush, not its memory
        assert log.flushed_offset >= second == part.high_watermark

    asyncio.run(run())


def test_acks_all_flushes_the_leader_even_while_an_earlier_flush_runs(tmp_path):
    """Under `replica.visibility=all-flushed` a replicated acks=-1 waits for the HW, which
    the leader's own flushed end bounds.
    Its request to flush can come while a flush that does not cover it is running: the
    flusher must go on until it is covered, not leave the rest to the flush interval
    timer (an hour here, so the wait below is not a timing assertion: without the fix
    it fails at its 30 s)."""
    async def run():
        log = Log(tmp_path / "t-0", "t", 0, LogConfig(flush_interval_ms=3_600_000))
        log.high_watermark = 0
        part = Partition(log, 0, [0, 1], FlushScheduler(1).flusher(log), 1, leader_flush_first=True)
        part.become_leader(PartitionState(0, 1, [0, 1]), 0)
        flushed, gate, real_flush = threading.Event(), threading.Event(), log.flush

        def held_flush():  # the first flush has synced the first message, then is held
            result = real_flush()
            flushed.set()
            gate.wait(10)
            return result

        log.flush = held_flush
        append(log, [b"first"])
        part.flusher.flush_soon()
        await asyncio.get_running_loop().run_in_executor(None, flushed.wait, 10)
        log.flush = real_flush
        second = append(log, [b"second"]).next_offset
        waiting = asyncio.ensure_future(part.wait_committed(second, 1, 0))
        part.record_fetch(1, second, second)  # the follower has everything on its disk
        await asyncio.sleep(0)
        gate.set()
        await asyncio.wait_for(waiting, 30)
        assert log.flushed_offset == second == part.high_watermark

    asyncio.run(run())


def test_a_waiter_that_starts_after_a_demotion_is_refused_at_once(tmp_path):
    """The window between an append and its commit waiter: leadership moved away (and
    the log may be truncated) before the waiter starts. It must not wait — let alone
    succeed when this broker leads again and its high watermark passes the offset."""
    async def run():
        part = leader(tmp_path, isr=(0, 1))
        end = append(part.log, [b"a"]).next_offset
        part.become_follower(PartitionState(1, 4, [0, 1]), 1)
        with pytest.raises(NotLeaderForPartition):
            await part.wait_committed(end, 3, 10_000)
        part.log.truncate_to(0)
        part.become_leader(PartitionState(0, 5, [0, 1]), 2)
        other = append(part.log, [b"b"]).next_offset
        part.log.flush()
        part.record_fetch(1, other, other)
        assert part.high_watermark >= end
        with pytest.raises(NotLeaderForPartition):
            await part.wait_committed(end, 3, 10_000)

    asyncio.run(run())


def test_a_waiter_of_an_earlier_epoch_survives_a_new_epoch_that_kept_its_bytes(tmp_path):
    """Leader again in a new epoch without following in between: the bytes are still
    in the log (the epoch cache says epoch 3 reaches them), so the waiter stands."""
    async def run():
        part = leader(tmp_path, isr=(0, 1))
        end = append(part.log, [b"a"]).next_offset
        waiting = asyncio.ensure_future(part.wait_committed(end, 3, 10_000))
        await asyncio.sleep(0)
        part.become_leader(PartitionState(0, 4, [0, 1]), 1)
        part.log.flush()
        part.record_fetch(1, end, end)
        await asyncio.wait_for(waiting, 10)
        assert part.holds_appended(3, end)
        assert not part.holds_appended(3, end + 1)  # epoch 4 starts at `end`

    asyncio.run(run())
