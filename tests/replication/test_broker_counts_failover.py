"""The brokers' record counts (the audit's `broker` tier) across leader changes: a
three-replica partition's leader is killed -9 mid-stream, comes back, and takes the lead
again (preferred-leader rebalance) while a producer keeps sending records of several
event hours. Each leader counts on its own copy from the node's `upto`; the counts must
equal the committed records exactly, per window — none counted twice, none missed."""

from __future__ import annotations

import threading
import time

from broker.client.brokercounts import read_broker_counts
from broker.client.producer import Producer
from harness.process import wait_until
from tests.integration.clientutil import per_window, read_topic
from broker.common.zklayout import create_topic
from tests.replication.replicated import (BROKER_SETTINGS, create_replicated_topic, pause_quietly, state,
                                          wait_for_state, wait_isr)

TOPIC = "kafka_written"
SETTINGS = {**BROKER_SETTINGS, "audit.count.interval.ms": 50, "auto.leader.rebalance.enable": True,
            "leader.imbalance.check.interval.seconds": 1, "leader.imbalance.per.broker.percentage": 0}


class Sender(threading.Thread):
    """Sends records of three event hours, one at a time with acks=-1, until stopped."""

    def __init__(self, zk_connect: str) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(zookeeper=zk_connect, acks=-1, mode="sync", monitoring=False, retries=10_000,
                                 retry_backoff_ms=100, delivery_timeout_ms=120_000, request_timeout_ms=10_000)
        self.stop, self.acknowledged, self.error = threading.Event(), [], None

    def run(self) -> None:
        now = int(time.time() * 1000)
        try:
            while not self.stop.is_set():
                i = len(self.acknowledged)
                self.producer.send(TOPIC, b"r%06d" % i, timestamp=now - (i % 3) * 13 * 3_600_000, partition=0)
                self.acknowledged.append(b"r%06d" % i)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            self.error = exc
        finally:
            self.producer.close(30)

    def sent_more(self, than: int) -> bool:
        assert self.error is None, self.error
        return len(self.acknowledged) > than


def upto(zk) -> int:
    return read_broker_counts(zk, [TOPIC]).upto.get((TOPIC, 0), -1)


def test_the_broker_tier_counts_every_committed_record_once_across_a_kill_and_a_return(cluster, zk, zk_connect):
    for broker_id in range(3):
        cluster.start_broker(broker_id, SETTINGS)
    first = create_replicated_topic(cluster, zk, TOPIC)[0][0]
    sender = Sender(zk_connect)
    sender.start()
    try:
        wait_until(lambda: upto(zk) > 0 and sender.sent_more(50), 60, "the first leader to count")
        counted_by_first = upto(zk)
        cluster.brokers[first].kill()  # kill -9, mid-stream
        second = wait_for_state(zk, TOPIC, 0, lambda s: s.leader not in (first, -1), "a new leader", 60).leader
        sent = len(sender.acknowledged)
        wait_until(lambda: sender.sent_more(sent + 50) and upto(zk) > counted_by_first, 60,
                   "the new leader to count on its copy")
        cluster.start_broker(first, SETTINGS)
        wait_isr(zk, TOPIC, {0, 1, 2}, timeout=60)
        wait_for_state(zk, TOPIC, 0, lambda s: s.leader == first, "the preferred leader to lead again", 60)
        counted_by_second = upto(zk)
        sent = len(sender.acknowledged)
        wait_until(lambda: sender.sent_more(sent + 50) and upto(zk) > counted_by_second, 60,
                   "the returned leader to count again")
    finally:
        sender.stop.set()
        sender.join(120)
    assert sender.error is None and state(zk, TOPIC).leader == first and second != first

    stored = wait_until(lambda: (m := read_topic(zk_connect, TOPIC)[0]) and len(m) >= len(sender.acknowledged) and m,
                        60, "every acknowledged record visible")
    assert set(sender.acknowledged) <= {m.value for m in stored}
    expected = per_window(TOPIC, stored)
    end = stored[-1].next_offset
    counts = wait_until(lambda: (c := read_broker_counts(zk, [TOPIC])).upto[(TOPIC, 0)] >= end and c, 60,
                        "the leader to count to the end")
    assert counts.upto[(TOPIC, 0)] == end and counts.began[(TOPIC, 0)] == 0
    assert counts.counts == expected  # every committed record once: none twice, none missed
    assert len(expected) == 3


def test_records_a_killed_leader_held_but_never_committed_are_not_counted(cluster, zk, zk_connect):
    """acks=1 records the leader appended while its followers could not fetch (paused)
    are lost when it is killed -9 before they replicate: the leader counted rounds over
    its log meanwhile (a one-replica beacon partition it leads proves a round saw them),
    but only below the high watermark, so they are in no count."""
    # the ISR keeps the paused followers: neither lagging nor dead for the test's few seconds
    settings = {**SETTINGS, "replica.lag.time.max.ms": 20_000, "zookeeper.session.timeout.ms": 10_000}
    for broker_id in range(3):
        cluster.start_broker(broker_id, settings)
    first, *followers = create_replicated_topic(cluster, zk, TOPIC)[0]
    beacon = next(p for p, replicas in create_topic(zk, "beacon", 3, 1).items() if replicas == [first])
    now = int(time.time() * 1000)
    with Producer(zookeeper=zk_connect, acks=-1, mode="sync", monitoring=False, retries=10_000,
                  retry_backoff_ms=100, delivery_timeout_ms=120_000) as committed:
        for i in range(20):
            committed.send(TOPIC, b"c%d" % i, timestamp=now - i % 2 * 3_600_000, partition=0)
        pause_quietly(cluster, followers)
        try:
            with Producer(zookeeper=zk_connect, acks=1, mode="sync", monitoring=False,
                          enable_idempotence=False) as leader_only:  # no producer id from a paused broker
                lost = [leader_only.send(TOPIC, b"lost%d" % i, timestamp=now, partition=0) for i in range(30)]
                mark = leader_only.send("beacon", b"after", timestamp=now, partition=beacon).offset + 1
            wait_until(lambda: read_broker_counts(zk, ["beacon"]).upto.get(("beacon", beacon), -1) >= mark, 30,
                       "a counting round after the leader-only appends")
            cluster.brokers[first].kill()
        finally:
            for broker_id in followers:
                cluster.brokers[broker_id].resume()
        wait_for_state(zk, TOPIC, 0, lambda s: s.leader in followers, "a follower to lead", 60)
        for i in range(20):
            committed.send(TOPIC, b"d%d" % i, timestamp=now - 3_600_000, partition=0)
    cluster.start_broker(first, settings)
    wait_isr(zk, TOPIC, {0, 1, 2}, timeout=60)

    stored = read_topic(zk_connect, TOPIC)[0]
    assert len(lost) == 30 and not {m.value for m in stored} & {b"lost%d" % i for i in range(30)}
    assert len(stored) == 40
    end = stored[-1].next_offset
    counts = wait_until(lambda: (c := read_broker_counts(zk, [TOPIC])).upto[(TOPIC, 0)] >= end and c, 60,
                        "the new leader to count to the end")
    assert counts.counts == per_window(TOPIC, stored) and sum(counts.counts.values()) == 40
