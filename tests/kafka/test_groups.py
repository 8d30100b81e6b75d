"""Kafka consumer groups through the Kafka listener with librdkafka (confluent-kafka):
three members in processes of their own, one killed with SIGKILL; the others take over
its partitions from its last committed offsets (docs/kafka.md, "Consumer groups").
Records are written by logbus's own producer, so the test is about groups alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from broker.client.offsets import group_offsets
from broker.common.zklayout import kafka_group_path, read_partition_state
from broker.server.controller import read_controller
from broker.server.kafka.groupstore import StoredGroup
from harness.process import wait_until
from tests.integration.brokerutil import connect, produce, read_partition

MEMBER = Path(__file__).with_name("group_member.py")
PARTITIONS, RECORDS = 6, 150
FAST_GROUPS = {"group.min.session.timeout.ms": 1000, "group.initial.rebalance.delay.ms": 500}


@pytest.fixture
def group_broker(cluster):
    return cluster.start_broker(0, settings=FAST_GROUPS, kafka=True)


class MemberLog:
    """What one member process wrote: (time, event, partition, offset) lines."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[tuple[float, str, list[int]]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            words = line.split()
            if len(words) >= 2:
                out.append((float(words[0]), words[1], [int(w) for w in words[2:] if w.lstrip("-").isdigit()]))
        return out

    def events(self, kind: str) -> list[tuple[float, int, int]]:
        return [(t, ps[0], ps[1]) for t, k, ps in self.lines() if k == kind and len(ps) >= 2]

    def assignment(self) -> list[int] | None:
        assigned = [ps for _, k, ps in self.lines() if k == "assigned"]
        return assigned[-1] if assigned else None


def start_member(bootstrap: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(MEMBER), bootstrap, "g", "t", str(log), "0.02"],
                            env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def write_records(brokers: list, zk, partitions: int, replication_factor: int = 1) -> dict[int, list[int]]:
    """RECORDS records in each partition of a new topic t, by logbus's own producer at
    each partition's leader (acks=-1); their offsets."""
    conns = {b.broker_id: connect(b) for b in brokers}
    conns[brokers[0].broker_id].create_topic("t", partitions, replication_factor)
    offsets = {}
    for p in range(partitions):
        leader = wait_until(lambda: read_partition_state(zk, "t", p), 30, f"t-{p}'s state").state.leader
        produce(conns[leader], "t", p, [f"{p}-{i}".encode() for i in range(RECORDS)])
        offsets[p] = [m.offset for m in read_partition(conns[leader], "t", p)]
    assert all(len(o) == RECORDS for o in offsets.values())
    return offsets


def everything_read(logs: list[MemberLog], offsets: dict[int, list[int]]) -> bool:
    seen = {(p, o) for log in logs for _, p, o in log.events("consumed")}
    return seen >= {(p, o) for p, os in offsets.items() for o in os}


def assert_nothing_read_again_once_committed(logs: list[MemberLog]) -> None:
    commits = defaultdict(list)
    for log in logs:
        for t, p, o in log.events("committed"):
            commits[(p, o)].append(t)
    reread = [(p, o) for log in logs for t, p, o in log.events("consumed") if any(c < t for c in commits[(p, o)])]
    assert not reread, f"records read again after their offset was committed: {reread[:5]}"


def stop_all(members: list[subprocess.Popen]) -> None:
    for member in members:
        if member.poll() is None:
            member.kill()
            member.wait()


def test_three_librdkafka_members_one_killed_the_others_resume_its_partitions_exactly(group_broker, zk, tmp_path):
    offsets = write_records([group_broker], zk, PARTITIONS)

    logs = [MemberLog(tmp_path / f"member-{i}.log") for i in range(3)]
    members = [start_member(group_broker.kafka_bootstrap, log.path) for log in logs]
    try:
        def balanced() -> bool:
            shares = [log.assignment() for log in logs]
            return all(s is not None and len(s) == 2 for s in shares) and \
                sorted(p for s in shares for p in s) == list(range(PARTITIONS))

        wait_until(balanced, 90, "three members with two partitions each")
        victim, survivors = logs[2], logs[:2]
        wait_until(lambda: len(victim.events("committed")) >= 10, 60, "the third member to commit some records")
        members[2].send_signal(signal.SIGKILL)
        members[2].wait()
        killed_at = victim.lines()[-1][0]
        orphaned = victim.assignment()

        wait_until(lambda: everything_read(logs, offsets), 120, "the survivors to read every record")
        last = {p: os[-1] + 1 for p, os in offsets.items()}
        wait_until(lambda: group_offsets(zk, "g", "t", list(range(PARTITIONS))) == last, 30,
                   "the group's committed offsets, at the native groups' ZooKeeper nodes, to reach the end")
    finally:
        stop_all(members)

    # the survivors took the victim's partitions and started right after its last commit
    for p in orphaned:
        committed = [o for _, q, o in victim.events("committed") if q == p]
        consumed = [o for _, q, o in victim.events("consumed") if q == p]
        taken = sorted((t, o) for log in survivors for t, q, o in log.events("consumed") if q == p and t > killed_at)
        assert taken, f"nobody took partition {p} over"
        resumed_at = offsets[p].index(taken[0][1])
        expected = {offsets[p].index(committed[-1]) + 1 if committed else 0}
        if consumed:
            expected.add(offsets[p].index(consumed[-1]) + 1)  # its last commit landed, unlogged
        assert resumed_at in expected, (p, resumed_at, expected)

    assert_nothing_read_again_once_committed(logs)


def test_the_coordinators_broker_killed_under_a_consuming_group(cluster, zk, tmp_path):
    """kill -9 of the controller, which coordinates the group: the other broker takes
    over both roles, the members find it, rejoin in a later generation and read on from
    their committed offsets: nothing skipped, nothing committed read again."""
    brokers = [cluster.start_broker(i, settings={**FAST_GROUPS, "zookeeper.session.timeout.ms": 4000}, kafka=True)
               for i in range(2)]
    offsets = write_records(brokers, zk, 4, replication_factor=2)
    wait_until(lambda: read_controller(zk) is not None, 30, "a controller")
    coordinator = read_controller(zk)
    bootstrap = ",".join(b.kafka_bootstrap for b in brokers)
    logs = [MemberLog(tmp_path / f"member-{i}.log") for i in range(2)]
    members = [start_member(bootstrap, log.path) for log in logs]
    try:
        wait_until(lambda: all(len(log.events("committed")) >= 10 for log in logs), 90,
                   "both members to commit some records")
        generation = StoredGroup.decode(zk.get(kafka_group_path("g"))[0]).generation
        cluster.brokers[coordinator].kill()
        wait_until(lambda: everything_read(logs, offsets), 180, "the members to read every record")
        last = {p: os[-1] + 1 for p, os in offsets.items()}
        wait_until(lambda: group_offsets(zk, "g", "t", list(offsets)) == last, 60,
                   "the group's committed offsets to reach the end")
    finally:
        stop_all(members)
    assert read_controller(zk) != coordinator
    assert StoredGroup.decode(zk.get(kafka_group_path("g"))[0]).generation > generation, \
        "the new coordinator's generations follow the old one's"
    assert_nothing_read_again_once_committed(logs)
