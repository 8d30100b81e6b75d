"""The leader's side of a follower's fetch session (ReplicaManager.replica_fetch) on real
logs, without a network: a full fetch starts the session and hears about every
partition; later fetches name only what moved and hear only what changed; a partition
left unnamed stays caught up, and is still answered when its leadership is lost."""

import asyncio

import pytest

from broker.common.errors import ErrorCode, InvalidRequest
from broker.common.protocol import Reader, ReplicaFetchPartition, ReplicaFetchRequest, decode_replica_fetch
from broker.common.zklayout import PartitionState
from broker.server.config import BrokerConfig
from broker.server.log.log import Log, LogConfig
from broker.server.log.scheduler import FlushScheduler
from broker.server.log.segment import FileRegion
from broker.server.replication.manager import ReplicaManager
from broker.server.replication.partition import Partition
from tests.unit.test_log import append

EPOCH = 3


def leading(tmp_path, partitions: int) -> ReplicaManager:
    """Broker 0 leading partitions 0..n-1 of "t" with followers 1 and 2 in sync."""
    config = BrokerConfig.from_settings({"broker.id": "0", "log.dir": str(tmp_path), "zookeeper.connect": "zk:2181"})
    scheduler = FlushScheduler(1)
    manager = ReplicaManager(config, None, scheduler, None, None, None)
    for p in range(partitions):
        log = Log(tmp_path / f"t-{p}", "t", p, LogConfig())
        log.high_watermark = 0
        part = manager.partitions[("t", p)] = Partition(log, 0, [0, 1, 2], scheduler.flusher(log), 1)
        part.become_leader(PartitionState(0, EPOCH, [0, 1, 2]), 0)
    return manager


async def fetch(manager, full: bool, named: dict[int, int], wait_ms: int = 0) -> dict:
    """Follower 1 fetches, naming {partition: its log end (= flushed end)}; the answer by partition."""
    req = ReplicaFetchRequest(1, wait_ms, full, tuple(
        ReplicaFetchPartition("t", p, EPOCH, end, end, 1 << 20) for p, end in named.items()))
    body = await manager.replica_fetch(req)
    frame = b"".join(part.read() if isinstance(part, FileRegion) else bytes(part) for part in body)
    return {key[1]: result for key, result in decode_replica_fetch(Reader(frame))}


def test_a_session_answers_only_what_changed(tmp_path):
    async def run():
        manager = leading(tmp_path, 3)
        first = await fetch(manager, True, {0: 0, 1: 0, 2: 0})
        assert sorted(first) == [0, 1, 2]  # a full fetch hears every high watermark
        assert await fetch(manager, False, {}) == {}  # nothing moved, nothing to say
        end = append(manager.partitions[("t", 1)].log, [b"a", b"b"]).next_offset
        answer = await fetch(manager, False, {})
        assert list(answer) == [1] and len(answer[1].value.messages) == end  # its bytes, from its last position
        part = manager.partitions[("t", 1)]
        part.log.flush()
        part.record_fetch(2, end, end)  # the other follower has them too
        moved = await fetch(manager, False, {1: end})  # follower 1 has them now: the high watermark moves
        assert list(moved) == [1] and moved[1].value.high_watermark == end
        assert await fetch(manager, False, {}) == {}

    asyncio.run(run())


def test_a_long_poll_wakes_for_an_unnamed_partition(tmp_path):
    async def run():
        manager = leading(tmp_path, 2)
        await fetch(manager, True, {0: 0, 1: 0})
        poll = asyncio.ensure_future(fetch(manager, False, {}, wait_ms=30_000))
        await asyncio.sleep(0.05)
        assert not poll.done()
        append(manager.partitions[("t", 0)].log, [b"x"])
        manager.partitions[("t", 0)].appended()
        answer = await asyncio.wait_for(poll, 10)
        assert list(answer) == [0] and len(answer[0].value.messages) > 0

    asyncio.run(run())


def test_an_unnamed_partition_stays_caught_up_and_is_told_when_its_leadership_is_lost(tmp_path):
    async def run():
        manager = leading(tmp_path, 2)
        await fetch(manager, True, {0: 0, 1: 0})
        part = manager.partitions[("t", 0)]
        before = part.followers[1].caught_up_at
        await asyncio.sleep(0.01)
        await fetch(manager, False, {})
        assert part.followers[1].caught_up_at > before  # not named, still at the end: caught up now
        part.become_follower(PartitionState(2, EPOCH + 1, [2, 1]), 1)
        answer = await fetch(manager, False, {})
        assert list(answer) == [0] and answer[0].error_code == ErrorCode.NOT_LEADER_FOR_PARTITION

    asyncio.run(run())


def test_a_fetch_naming_changes_without_a_session_is_refused(tmp_path):
    async def run():
        manager = leading(tmp_path, 1)
        with pytest.raises(InvalidRequest, match="send a full fetch"):
            await fetch(manager, False, {0: 0})

    asyncio.run(run())
