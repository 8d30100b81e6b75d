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
                            env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_three_librdkafka_members_one_killed_the_others_resume_its_partitions_exactly(group_broker, zk, tmp_path):
    conn = connect(group_broker)
    conn.create_topic("t", PARTITIONS)
    for p in range(PARTITIONS):
        produce(conn, "t", p, [f"{p}-{i}".encode() for i in range(RECORDS)])
    offsets = {p: [m.offset for m in read_partition(conn, "t", p)] for p in range(PARTITIONS)}
    assert all(len(o) == RECORDS for o in offsets.values())

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

        def everything_read() -> bool:
            seen = {(p, o) for log in logs for _, p, o in log.events("consumed")}
            return seen >= {(p, o) for p, os in offsets.items() for o in os}

        wait_until(everything_read, 120, "the survivors to read every record")
        last = {p: os[-1] + 1 for p, os in offsets.items()}
        wait_until(lambda: group_offsets(zk, "g", "t", list(range(PARTITIONS))) == last, 30,
                   "the group's committed offsets, at the native groups' ZooKeeper nodes, to reach the end")
    finally:
        for member in members:
            if member.poll() is None:
                member.kill()
                member.wait()

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

    # no record read again once committed: every read after a commit of that record is a violation
    commits = defaultdict(list)
    for log in logs:
        for t, p, o in log.events("committed"):
            commits[(p, o)].append(t)
    reread = [(p, o) for log in logs for t, p, o in log.events("consumed") if any(c < t for c in commits[(p, o)])]
    assert not reread, f"records read again after their offset was committed: {reread[:5]}"
