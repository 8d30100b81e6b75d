"""The idempotent producer under the conditions that made producers store messages
twice (issue 23; docs/clients.md, "Idempotence"): a broker paused past the producer's
timeout, leaders killed under acks=-1, brokers restarted between a batch and its retry,
a follower taking the lead, events stamped long before they are sent (issue 33) — and
the broker's refusals of batches that do not follow. Real ZooKeeper ensemble and
broker processes."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter

import pytest

from broker.client.connection import BrokerConnection
from broker.client.producer import Producer
from broker.common.errors import InvalidProducerEpoch, OutOfOrderSequence
from broker.common.message import BatchIdentity, checksum, encode_batch, encode_message_set, iter_messages, now_ms
from harness.cluster import BrokerProcess
from harness.process import wait_until
from tests.integration.brokerutil import connect, produce, read_partition
from tests.replication.faults import refuse_each_partitions_first_append
from tests.replication.history import (
    IdempotentProducerWorker, SendLog, check_history, read_replica, wait_healed,
)
from tests.replication.replicated import (
    BROKER_SETTINGS, create_replicated_topic, kill_leader_and_wait_back, state, wait_for_state, wait_identical,
    wait_leading,
)

PID = 4_242_424_242
THIRTY_HOURS_MS = 30 * 3600 * 1000  # older than producer.id.expiration.ms's default, one day
MARKER = "retention-marker"
# a retention check every 200 ms, and one topic whose every rolled segment it deletes
# (kept to 1 byte), so a test sees in the broker's log that a check has run
RETENTION_CHECKS = {"log.retention.check.interval.ms": 200, "log.segment.bytes": 4096,
                    "log.retention.bytes.per.topic": f"{MARKER}:1"}


def produce_batch(conn: BrokerConnection, topic: str, values: list[bytes], identity: BatchIdentity,
                  acks: int = -1, partition: int = 0, timestamp: int | None = None):
    batch = encode_batch([(None, v, now_ms() if timestamp is None else timestamp) for v in values], identity)
    return conn.produce(topic, partition, batch, acks=acks)


def wait_for_retention_checks(broker: BrokerProcess, checks: int = 2) -> None:
    """Return once a whole retention check has run on `broker` (started with
    RETENTION_CHECKS) after this call. Each round rolls a segment of MARKER and waits
    for the check that deletes it; checks run one after another, so the second round's
    check started after the first round's ended, which was after this call."""
    with connect(broker) as conn:
        for _ in range(checks):
            mark = broker.log_size()
            for _ in range(2):  # the second append rolls the segment the first wrote to
                produce(conn, MARKER, 0, [b"m" * 3000], acks=1)
            wait_until(lambda: broker.logged_since(mark, f"{MARKER}-0: retention deleted"), 30,
                       f"a retention check on broker {broker.broker_id}")


def stored(conn: BrokerConnection, topic: str, partition: int = 0) -> Counter:
    return Counter(m.value for m in read_partition(conn, topic, partition))


def test_a_broker_paused_past_the_producers_timeout_stores_each_value_once(cluster, zk_connect):
    """Issue 23's finding, each round: the broker SIGSTOPped for 8 s while a send_many
    of 20 is in flight; the producer times out (its socket after 1 + 5 s) and retries;
    on SIGCONT the broker reads the stale request and the retry. Without idempotence 2
    of 3 rounds stored all 20 twice."""
    broker = cluster.start_broker(0)
    with Producer(zookeeper=zk_connect, acks=1, request_timeout_ms=1000, mode="async", monitoring=False, retries=50,
                  retry_backoff_ms=200, delivery_timeout_ms=90_000) as producer:
        for round_ in range(3):
            values = [b"round %d value %02d" % (round_, i) for i in range(20)]
            producer.send_many("paused", values[:1], partition=0).result(30)  # the topic exists, the id is known
            broker.pause()
            try:
                future = producer.send_many("paused", values[1:], partition=0)
                time.sleep(8)
            finally:
                broker.resume()
            assert future.result(90) == 19
        report = producer.flush(60)
    assert report.ok and report.delivered == 60 and not report.failed
    with connect(broker) as conn:  # acks=1 answers before the flush: an acks=-1 append after
        produce(conn, "paused", 0, [b"flushed"], acks=-1)  # everything answers once all of it is flushed
        counts = stored(conn, "paused")
        del counts[b"flushed"]
    assert sum(counts.values()) == 60 and set(counts.values()) == {1}, counts.most_common(3)


def test_leaders_killed_ten_times_under_acks_all_leave_every_value_once(cluster, zk):
    """An RF 3 partition, two idempotent producers with acks=-1 retrying on their own,
    and its leader killed with SIGKILL ten times (restarted each time): the history
    checker finds every acknowledged value at its offset and no value twice."""
    for broker_id in range(3):
        cluster.start_broker(broker_id, BROKER_SETTINGS)
    topic = "killed"
    assignment = create_replicated_topic(cluster, zk, topic, partitions=1, replication_factor=3)
    log, stop = SendLog(), threading.Event()
    workers = [IdempotentProducerWorker(i, cluster.zookeeper, topic, 0, log, stop) for i in range(2)]
    for worker in workers:
        worker.start()
    try:
        for kill in range(10):
            wait_until(lambda: len(log.acked) > 200 * (kill + 1), 60, f"acknowledgements before kill {kill}")
            kill_leader_and_wait_back(cluster, zk, topic)
    finally:
        stop.set()
        for worker in workers:
            worker.join(180)
    unhealed = wait_healed(zk, cluster, topic, assignment, None, 60)
    assert not unhealed
    replicas = {0: {b: read_replica(cluster.brokers[b].log_dir, topic, 0) for b in assignment[0]}}
    verdict = check_history(replicas, log, [])
    assert verdict.ok, verdict.problems[:20]
    assert verdict.stats["acked"] == verdict.stats["sent"] and not log.failures, verdict.stats


@pytest.mark.parametrize("stop", ["kill", "clean"])
def test_a_retry_after_a_broker_restart_is_still_a_duplicate(cluster, stop):
    """A batch appended, the broker stopped (SIGKILL: recovery rebuilds the producer
    state from snapshot and log; clean: from the snapshot written at shutdown), then the
    retry: answered with the first append's offsets, stored once."""
    broker = cluster.start_broker(0, {"log.segment.bytes": 4096})
    identity = BatchIdentity(PID, 0, 0, 3)
    with connect(broker) as conn:
        for i in range(40):  # several segments, so recovery starts from a snapshot
            produce_batch(conn, "restarted", [b"filler %02d" % i], BatchIdentity(PID + 1, 0, i, 1))
        first = produce_batch(conn, "restarted", [b"a", b"b", b"c"], identity)
    if stop == "kill":
        broker.kill()
    else:
        broker.stop()
    broker.start()
    with connect(broker) as conn:
        retry = produce_batch(conn, "restarted", [b"a", b"b", b"c"], identity)
        assert (retry.base_offset, retry.next_offset) == (first.base_offset, first.next_offset)
        counts = stored(conn, "restarted")
        assert [counts[v] for v in (b"a", b"b", b"c")] == [1, 1, 1]
        assert produce_batch(conn, "restarted", [b"d"], BatchIdentity(PID, 0, 3, 1)).base_offset == first.next_offset


@pytest.mark.parametrize("stop", ["retention check", "clean", "kill"])
def test_a_retry_of_events_stamped_30_hours_ago_is_still_a_duplicate(cluster, stop):
    """Issue 33: a producer id was forgotten by its messages' timestamps, so a batch of
    events stamped 30 h ago lost its deduplication at the first retention check or
    restart after its append, and its retry was stored twice. An id is now idle by the
    broker's clock since its last append; producer.id.expiration.ms at its default."""
    broker = cluster.start_broker(0, RETENTION_CHECKS)
    identity = BatchIdentity(PID, 0, 0, 2)
    stamped = now_ms() - THIRTY_HOURS_MS
    with connect(broker) as conn:
        first = produce_batch(conn, "backfill", [b"late", b"event"], identity, timestamp=stamped)
    if stop == "kill":
        broker.kill()
        broker.start()
    elif stop == "clean":
        broker.stop()
        broker.start()
    wait_for_retention_checks(broker)
    with connect(broker) as conn:
        retry = produce_batch(conn, "backfill", [b"late", b"event"], identity, timestamp=stamped)
        assert (retry.base_offset, retry.next_offset) == (first.base_offset, first.next_offset)
        assert stored(conn, "backfill") == Counter({b"late": 1, b"event": 1})


def test_a_new_leader_dedupes_a_retry_of_old_events_after_its_retention_check(cluster, zk):
    """Broker A appends (acks=-1) a batch of events stamped 30 h ago, is killed, and
    follower B leads; B runs a retention check; the producer's retry of the batch to B
    is a duplicate. B counts the id's idleness from its own append of the replicated
    bytes, after A's: a new leader never forgets an id before the old one would have."""
    for broker_id in range(2):
        cluster.start_broker(broker_id, {**BROKER_SETTINGS, **RETENTION_CHECKS})
    old, new = create_replicated_topic(cluster, zk, "late-handover", replication_factor=2)[0]
    identity = BatchIdentity(PID, 0, 0, 2)
    stamped = now_ms() - THIRTY_HOURS_MS
    with connect(cluster.brokers[old]) as conn:
        first = produce_batch(conn, "late-handover", [b"late", b"event"], identity, timestamp=stamped)
    cluster.brokers[old].kill()
    wait_for_state(zk, "late-handover", 0, lambda s: s.leader == new, f"broker {new} to lead", 60)
    wait_leading(cluster, new, "late-handover")
    wait_for_retention_checks(cluster.brokers[new])
    with connect(cluster.brokers[new]) as conn:
        retry = produce_batch(conn, "late-handover", [b"late", b"event"], identity, timestamp=stamped)
        assert (retry.base_offset, retry.next_offset) == (first.base_offset, first.next_offset)
        assert stored(conn, "late-handover") == Counter({b"late": 1, b"event": 1})


def test_a_follower_that_takes_the_lead_dedupes_a_retry_of_the_old_leaders_batch(cluster, zk):
    """Acknowledged with acks=-1 by broker A, A killed, B leads: the producer's retry of
    that batch (its answer was lost with A) is answered with the same offsets by B,
    which learnt the producer state from the bytes it replicated."""
    for broker_id in range(2):
        cluster.start_broker(broker_id, BROKER_SETTINGS)
    replicas = create_replicated_topic(cluster, zk, "handover", replication_factor=2)[0]
    old, new = replicas
    identity = BatchIdentity(PID, 0, 0, 2)
    with connect(cluster.brokers[old]) as conn:
        first = produce_batch(conn, "handover", [b"once", b"only"], identity)
    cluster.brokers[old].kill()
    wait_for_state(zk, "handover", 0, lambda s: s.leader == new, f"broker {new} to lead", 60)
    wait_leading(cluster, new, "handover")
    with connect(cluster.brokers[new]) as conn:
        retry = produce_batch(conn, "handover", [b"once", b"only"], identity)
        assert (retry.base_offset, retry.next_offset) == (first.base_offset, first.next_offset)
        counts = stored(conn, "handover")
    assert counts == Counter({b"once": 1, b"only": 1})


def test_a_first_batch_refused_while_the_next_ones_land_is_sent_again_not_counted_as_a_duplicate(
        cluster, zk, zk_connect, caplog):
    """The race behind the producer state's floor, end to end (docs/protocol.md): a
    broker that learns of a topic after the producer refuses the producer's first batch
    of each partition, and appends the four behind it already in flight. The first
    batch's retry then comes before the first sequence the partition holds. Answered
    DuplicateSequence, as before the floor, it counted as delivered and its ten values
    were lost; now it is OutOfOrderSequence, and the producer sends it again in a new
    epoch."""
    cluster.start_broker(0, BROKER_SETTINGS, preamble=refuse_each_partitions_first_append("late"))
    create_replicated_topic(cluster, zk, "late", partitions=2, replication_factor=1)
    values = {p: [b"partition %d value %02d" % (p, i) for i in range(50)] for p in (0, 1)}
    caplog.set_level(logging.INFO, logger="broker.client.sender")
    with Producer(zookeeper=zk_connect, acks=1, mode="async", monitoring=False, batch_size=10, linger_ms=1000,
                  retry_backoff_ms=50) as producer:
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1.0)  # the sender waits for the GIL until all ten batches are queued: one round
        try:
            futures = [producer.send_many("late", values[p], partition=p) for p in (0, 1)]
        finally:
            sys.setswitchinterval(interval)
        assert [f.result(60) for f in futures] == [50, 50]
    with connect(cluster.brokers[0]) as conn:
        for p in (0, 1):
            # acks=1 data is visible once flushed; without the floor the first ten never come
            wait_until(lambda p=p: len(read_partition(conn, "late", p)) >= 50, 10, f"late-{p} to show 50 values")
            assert stored(conn, "late", p) == Counter(values[p])
    assert caplog.text.count("failed (UnknownTopic") == 2
    assert caplog.text.count("failed (OutOfOrderSequence") == 2  # the race happened: the retries came before the floor


def test_out_of_order_and_fenced_batches_are_refused_and_an_expired_id_starts_afresh(cluster):
    broker = cluster.start_broker(0, {"producer.id.expiration.ms": 5000, "log.retention.check.interval.ms": 200})
    with connect(broker) as conn:
        produce_batch(conn, "checked", [b"first"], BatchIdentity(PID, 2, 0, 1))
        end = conn.offsets("checked", 0, -1)[0]
        with pytest.raises(OutOfOrderSequence, match="expected sequence 1, got 5"):
            produce_batch(conn, "checked", [b"gap"], BatchIdentity(PID, 2, 5, 1))
        with pytest.raises(InvalidProducerEpoch, match="fenced"):
            produce_batch(conn, "checked", [b"stale"], BatchIdentity(PID, 1, 1, 1))
        assert conn.offsets("checked", 0, -1)[0] == end  # nothing appended
        assert list(stored(conn, "checked")) == [b"first"]
        # idle past producer.id.expiration.ms (by the broker's clock since its append):
        # forgotten at a retention pass, so a batch at any sequence starts afresh
        wait_until(lambda: _accepted(conn, BatchIdentity(PID, 2, 9, 1)), 30, "the expired id to start afresh")
        assert stored(conn, "checked") == Counter({b"first": 1, b"afresh": 1})


def _accepted(conn: BrokerConnection, identity: BatchIdentity) -> bool:
    try:
        produce_batch(conn, "checked", [b"afresh"], identity)
        return True
    except OutOfOrderSequence:
        return False


def test_old_formats_read_recover_and_replicate_next_to_batches(cluster, zk):
    """Magic 1 and 2 entries beside magic-3 batches on an RF 2 partition: replicated
    byte for byte, read back in order, and read back again after the leader is killed
    and recovers."""
    for broker_id in range(2):
        cluster.start_broker(broker_id, BROKER_SETTINGS)
    replicas = create_replicated_topic(cluster, zk, "mixed", replication_factor=2)[0]
    v2 = encode_message_set([(None, b"magic 2", 1)])
    v1 = bytearray(encode_message_set([(None, b"magic 1", 1)]))
    v1[4] = 1
    v1[6:10] = checksum(bytes(v1[10:])).to_bytes(4, "big")
    expected = [b"magic 1", b"batch a", b"batch b", b"magic 2", b"gzip batch"]
    with connect(cluster.brokers[replicas[0]]) as conn:
        conn.produce("mixed", 0, bytes(v1), acks=-1)
        produce_batch(conn, "mixed", [b"batch a", b"batch b"], BatchIdentity(PID, 0, 0, 2))
        conn.produce("mixed", 0, v2, acks=-1)
        gz = encode_batch([(None, b"gzip batch", 5)], BatchIdentity(PID, 0, 2, 1), "gzip")
        conn.produce("mixed", 0, gz, acks=-1)
        assert [m.value for m in read_partition(conn, "mixed", 0)] == expected
    data = wait_identical(cluster, "mixed", 0, replicas)
    assert [m.value for m in iter_messages(data, 0)] == expected
    before = state(zk, "mixed")
    cluster.brokers[replicas[0]].kill()
    cluster.brokers[replicas[0]].start()
    # the controller moves a restarted leader's partition (a new epoch), then the ISR
    # regains the other replica: the node as it was before the kill satisfies neither
    after = wait_for_state(zk, "mixed", 0, lambda s: s.leader_epoch > before.leader_epoch and len(s.isr) == 2,
                           "a new epoch with both replicas in the ISR", 60)
    leader = after.leader
    wait_leading(cluster, leader, "mixed")
    with connect(cluster.brokers[leader]) as conn:
        assert [m.value for m in read_partition(conn, "mixed", 0)] == expected
        retry = produce_batch(conn, "mixed", [b"gzip batch"], BatchIdentity(PID, 0, 2, 1))
        assert retry.base_offset == len(data) - len(gz)  # still known as a duplicate after recovery
