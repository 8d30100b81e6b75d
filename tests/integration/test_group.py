"""Consumer groups against real brokers and ZooKeeper: ownership, delivery, rebalances,
pub/sub across groups, resuming after a crash."""

from __future__ import annotations

import subprocess
import sys

from broker.client.group import ConsumerGroup
from broker.client.producer import Producer
from broker.common.zklayout import create_topic, read_offset
from harness.process import wait_until
from tests.integration.clientutil import Collector, entry_count, produce_batch_and_gzip_set, wait_visible

ALL = {("logs", p) for p in range(8)}


def start_topic(cluster, zk, zk_connect, count: int = 400, settings: dict | None = None) -> list[bytes]:
    cluster.start_broker(0, settings)
    cluster.start_broker(1, settings)
    create_topic(zk, "logs", 8)
    values = [b"%d:%d" % (i % 8, i) for i in range(count)]
    producer = Producer(zookeeper=zk_connect, mode="async", monitoring=False)
    for i, value in enumerate(values):
        producer.send("logs", value, partition=i % 8)
    assert producer.close(30).ok
    wait_visible(zk_connect, "logs", count)
    return values


def member(zk_connect: str, group: str = "g", **kwargs) -> ConsumerGroup:
    settings = dict(consumer_timeout_ms=200, max_wait_ms=100, rebalance_backoff_ms=100,
                    zookeeper_session_timeout_ms=2000)
    settings.update(kwargs)
    return ConsumerGroup(group, {"logs": 1}, zk_connect, **settings)


def balanced(members: list[ConsumerGroup], partitions=frozenset(ALL)) -> bool:
    """Every partition owned by exactly one member, and each member's share is what
    Algorithm 1 gives it (so no one is waiting to rebalance)."""
    shares = [set(m.owned()) for m in members]
    owned = [key for share in shares for key in share]
    return len(owned) == len(set(owned)) and set(owned) == set(partitions) and all(shares)


def test_each_partition_is_owned_by_exactly_one_member_and_every_message_arrives(cluster, zk, zk_connect):
    values = start_topic(cluster, zk, zk_connect)
    members = [member(zk_connect) for _ in range(3)]
    collectors = [Collector(m) for m in members]
    try:
        wait_until(lambda: balanced(members), 60, "a balanced group")
        wait_until(lambda: sum(len(c.values()) for c in collectors) >= len(values), 60, "every message")
        received = [v for c in collectors for v in c.values()]
        assert sorted(received) == sorted(values)
        # a loaded machine can expire a member's 2 s session meanwhile: it rebalances again
        wait_until(lambda: balanced(members), 60, "a balanced group after reading")
        owners = {p: m.consumer_id for m in members for (_, p) in m.owned()}
        assert sorted(owners) == list(range(8))
    finally:
        for c in collectors:
            c.close()


def test_messages_of_one_partition_arrive_in_order(cluster, zk, zk_connect):
    values = start_topic(cluster, zk, zk_connect)
    collector = Collector(member(zk_connect))
    try:
        wait_until(lambda: len(collector.values()) >= len(values), 60, "every message")
        by_partition: dict[int, list[int]] = {}
        for m in collector.messages:
            by_partition.setdefault(m.partition, []).append(m.offset)
        assert all(offsets == sorted(offsets) for offsets in by_partition.values())
        assert len(by_partition) == 8
    finally:
        collector.close()


def test_members_joining_and_leaving_rebalance_to_a_single_owner_per_partition(cluster, zk, zk_connect):
    start_topic(cluster, zk, zk_connect, count=16)
    members = [member(zk_connect)]
    try:
        wait_until(lambda: balanced(members), 60, "one member owning all")
        members += [member(zk_connect), member(zk_connect)]
        wait_until(lambda: balanced(members), 60, "three balanced members")
        assert sorted(len(m.owned()) for m in members) == [2, 3, 3]
        members.pop(0).close()
        wait_until(lambda: balanced(members), 60, "two balanced members after one left")
        assert sorted(len(m.owned()) for m in members) == [4, 4]
    finally:
        for m in members:
            m.close()


def test_killing_a_broker_triggers_a_rebalance_that_converges(cluster, zk, zk_connect):
    start_topic(cluster, zk, zk_connect, count=16, settings={"zookeeper.session.timeout.ms": 2000})
    members = [member(zk_connect) for _ in range(3)]
    try:
        wait_until(lambda: balanced(members), 60, "a balanced group")
        before = [m.rebalances for m in members]
        cluster.brokers[1].kill()
        wait_until(lambda: all(m.rebalances > b for m, b in zip(members, before)) and balanced(members), 60,
                   "every member to rebalance after the broker died")
    finally:
        for m in members:
            m.close()


def test_two_groups_each_receive_every_message(cluster, zk, zk_connect):
    values = start_topic(cluster, zk, zk_connect, count=200)
    collectors = [Collector(member(zk_connect, group)) for group in ("first", "second")]
    try:
        for c in collectors:
            wait_until(lambda: len(c.values()) >= len(values), 60, f"group {c.group.group} to get everything")
            assert sorted(c.values()) == sorted(values)
    finally:
        for c in collectors:
            c.close()


def test_commit_writes_the_next_offset_to_read(cluster, zk, zk_connect):
    start_topic(cluster, zk, zk_connect, count=8)
    group = member(zk_connect, auto_commit_interval_ms=0, consumer_timeout_ms=60_000)  # a loaded machine's first fetch
    try:
        stream = group.streams["logs"][0]
        message = next(iter(stream))
        group.commit()
        assert read_offset(zk, "g", "logs", message.partition) == message.next_offset
    finally:
        group.close()


def test_a_new_member_resumes_at_the_record_after_the_committed_one_inside_a_batch_and_a_gzip_set(
        cluster, zk, zk_connect):
    """Offsets are per record (docs/architecture.md, "Offsets"): a member that reads half
    of an idempotent batch, or half of a gzip set, commits the next record's offset —
    inside the entry — and the next member starts exactly there: every record once."""
    cluster.start_broker(0)
    create_topic(zk, "logs", 1)
    produce_batch_and_gzip_set(zk_connect, "logs")
    records = wait_visible(zk_connect, "logs", 20)[0]
    assert entry_count(records) == 2 and len(records) == 20
    read = []
    for take in (5, 10, 5):  # half the batch; its rest and half the gzip set; the rest of the set
        group = member(zk_connect, "halves", auto_commit_interval_ms=0, consumer_timeout_ms=60_000)
        try:
            stream = iter(group.streams["logs"][0])
            taken = [next(stream) for _ in range(take)]
        finally:
            group.close()  # commits what it handed out
        read += taken
        assert read_offset(zk, "halves", "logs", 0) == taken[-1].next_offset
        if len(read) < 20:
            assert taken[-1].next_offset == taken[-1].offset + 1  # the next record of the same entry
    assert [m.value for m in read] == [m.value for m in records]
    assert [m.offset for m in read] == [m.offset for m in records]


CRASHING_CONSUMER = """
import sys
from broker.client.group import ConsumerGroup
group = ConsumerGroup("resume", {"logs": 1}, sys.argv[1], auto_commit_interval_ms=0, zookeeper_session_timeout_ms=2000)
stream = iter(group.streams["logs"][0])
for _ in range(int(sys.argv[2])):
    print(next(stream).value.decode(), flush=True)
group.commit()
print("committed", flush=True)
for _ in range(int(sys.argv[3])):
    print(next(stream).value.decode(), flush=True)
print("waiting", flush=True)
sys.stdin.read()
"""


def test_a_successor_resumes_from_the_last_committed_offset_after_a_crash(cluster, zk, zk_connect):
    cluster.start_broker(0)
    create_topic(zk, "logs", 1)
    with Producer(zookeeper=zk_connect, monitoring=False) as producer:
        for i in range(200):
            producer.send("logs", b"%d" % i)
    wait_visible(zk_connect, "logs", 200)
    child = subprocess.Popen([sys.executable, "-c", CRASHING_CONSUMER, zk_connect, "100", "20"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        lines = []
        while not lines or lines[-1] != "waiting":
            line = child.stdout.readline()
            assert line, "the consumer exited early"
            lines.append(line.strip())
        child.kill()
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    first_life = [int(v) for v in lines if v.isdigit()]
    assert first_life == list(range(120))
    successor = Collector(member(zk_connect, "resume", rebalance_max_retries=50))
    try:
        wait_until(lambda: len(successor.values()) >= 100, 60, "the successor to read the rest")
        second_life = [int(v) for v in successor.values()]
    finally:
        successor.close()
    assert second_life[0] == 100  # the last committed offset
    assert set(first_life) | set(second_life) == set(range(200))  # nothing lost
    assert len(set(first_life) & set(second_life)) == 20  # handed out after the commit: delivered again
