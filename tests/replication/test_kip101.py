"""The two failures that made Kafka replace truncation to the high watermark with
leader epochs (KIP-101), replayed step by step with real brokers on a ZooKeeper
ensemble. Leadership moves because brokers die (the controller elects), never by
hand. After each: the replicas are byte-identical and every message acknowledged
with acks=-1 is at the offset it was acknowledged with.

(a) A double failover with a lagging follower: the follower lags, the leader acks
    alone, dies (the partition stays offline: unclean election is off), returns and
    leads again; then it dies with an unreplicated tail, the follower leads and
    writes a new epoch over that tail, and the old leader comes back as a follower.
(b) A leader restarting with a torn tail: it dies with an unreplicated tail, its
    last message is cut in half on disk while it is down, and it comes back as a
    follower of the replica that led meanwhile.
"""

from __future__ import annotations

from pathlib import Path

from broker.client.connection import BrokerConnection
from broker.client.producer import Producer
from broker.common.message import BatchIdentity, Codec, encode_batch, iter_messages
from harness.cluster import LocalCluster
from tests.integration.recordutil import check_every_offset, every_record, produce_mix
from tests.replication.replicated import (
    BROKER_SETTINGS, create_replicated_topic, pause_quietly, state, wait_for_state, wait_identical, wait_leading,
    zookeeper_client,
)

TOPIC = "kip101"


def values(label: str, count: int) -> list[bytes]:
    return [f"{label}-{i}".encode() for i in range(count)]


def sent(producer: Producer, batch: list[bytes]) -> dict[int, bytes]:
    """Send one at a time; {offset: value} of what was acknowledged."""
    return {producer.send(TOPIC, value, partition=0).offset: value for value in batch}


def assert_holds(data: bytes, acknowledged: dict[int, bytes], gone: list[bytes]) -> None:
    log = {m.offset: m.value for m in iter_messages(data, 0)}
    missing = {o: v for o, v in acknowledged.items() if log.get(o) != v}
    assert not missing, f"acknowledged messages lost or moved: {missing}"
    assert not set(gone) & set(log.values()), "an unacknowledged, truncated tail came back"
    assert len(log) == len(set(log.values())), "a message appears twice"


def producers(cluster) -> tuple[Producer, Producer]:
    common = dict(zookeeper=cluster.zookeeper, monitoring=False, retries=100, retry_backoff_ms=100,
                  delivery_timeout_ms=60_000)
    return Producer(acks=-1, **common), Producer(acks=1, **common)


def test_a_double_failover_with_a_lagging_follower_keeps_acknowledged_data(zookeeper_ensemble, tmp_path):
    with LocalCluster(zookeeper_ensemble.connect_string, tmp_path, settings=BROKER_SETTINGS) as cluster, \
            zookeeper_client(zookeeper_ensemble.connect_string) as zk:
        cluster.start(3)
        a, b = create_replicated_topic(cluster, zk, TOPIC, partitions=1, replication_factor=2)[0]
        all_isr, leader_only = producers(cluster)
        with all_isr, leader_only:
            acknowledged = sent(all_isr, values("both", 5))

            # B lags past the lag time: A shrinks the ISR to itself and acks alone (min.insync.replicas=1)
            cluster.brokers[b].pause()
            wait_for_state(zk, TOPIC, 0, lambda s: list(s.isr) == [a], f"the ISR shrunk to {a}")
            acknowledged |= sent(all_isr, values("a-alone", 5))

            # A dies: B is out of the ISR, so the partition goes offline rather than lose those
            cluster.brokers[a].kill()
            cluster.brokers[b].resume()
            wait_for_state(zk, TOPIC, 0, lambda s: s.leader == -1, "offline (unclean election is off)")

            # A returns and leads again; B catches up and rejoins the ISR
            cluster.start_broker(a)
            first = wait_for_state(zk, TOPIC, 0, lambda s: s.leader == a and sorted(s.isr) == sorted([a, b]),
                                   f"{a} leading again with {b} back in the ISR", timeout=60)
            acknowledged |= sent(all_isr, values("caught-up", 5))

            # A gets a tail B does not have (B paused, within the lag time), and dies
            pause_quietly(cluster, [b])
            tail = values("a-unreplicated", 5)
            sent(leader_only, tail)
            cluster.brokers[a].kill()
            cluster.brokers[b].resume()

            # B leads a new epoch and writes over the offsets of A's tail
            second = wait_for_state(zk, TOPIC, 0, lambda s: s.leader == b, f"{b} leading", timeout=60)
            assert second.leader_epoch > first.leader_epoch
            acknowledged |= sent(all_isr, values("b-leads", 8))

            # A returns as B's follower: it truncates its tail by leader epoch and converges
            cluster.start_broker(a)
            wait_for_state(zk, TOPIC, 0, lambda s: sorted(s.isr) == sorted([a, b]), f"{a} back in the ISR",
                           timeout=60)
            acknowledged |= sent(all_isr, values("after", 3))
        data = wait_identical(cluster, TOPIC, 0, [a, b])
        assert_holds(data, acknowledged, gone=tail)
        assert state(zk, TOPIC, 0).leader == b


def tear_last_message(partition_dir: Path) -> int:
    """Cut the partition's last message in half, as a crash mid-write leaves it;
    returns the bytes cut."""
    segment = max(partition_dir.glob("*.kafka"), key=lambda p: int(p.stem))
    data = segment.read_bytes()
    last = [m.offset for m in iter_messages(data, 0)][-1]
    cut_at = last + (len(data) - last) // 2
    with open(segment, "r+b") as file:
        file.truncate(cut_at)
    return len(data) - cut_at


def test_a_leader_restarting_with_a_torn_tail_truncates_by_epoch_and_converges(zookeeper_ensemble, tmp_path):
    with LocalCluster(zookeeper_ensemble.connect_string, tmp_path, settings=BROKER_SETTINGS) as cluster, \
            zookeeper_client(zookeeper_ensemble.connect_string) as zk:
        cluster.start(3)
        a, b, c = create_replicated_topic(cluster, zk, TOPIC, partitions=1, replication_factor=3)[0]
        all_isr, leader_only = producers(cluster)
        with all_isr, leader_only:
            acknowledged = sent(all_isr, values("all", 10))
            before = state(zk, TOPIC, 0)

            # A writes a tail no follower has (both paused, within the lag time), and dies
            pause_quietly(cluster, [b, c])
            tail = values("a-unreplicated", 4)
            sent(leader_only, tail)
            cluster.brokers[a].kill()
            cluster.brokers[b].resume()
            cluster.brokers[c].resume()
            # ... and the crash tore its last message
            assert tear_last_message(cluster.brokers[a].log_dir / f"{TOPIC}-0") > 0

            after = wait_for_state(zk, TOPIC, 0, lambda s: s.leader in (b, c), "a new leader", timeout=60)
            assert after.leader_epoch > before.leader_epoch
            acknowledged |= sent(all_isr, values("new-epoch", 10))

            # A recovers its log (the torn message goes), follows, truncates its tail by epoch
            cluster.start_broker(a)
            wait_for_state(zk, TOPIC, 0, lambda s: sorted(s.isr) == sorted([a, b, c]), f"{a} back in the ISR",
                           timeout=60)
            acknowledged |= sent(all_isr, values("after", 3))
        data = wait_identical(cluster, TOPIC, 0, [a, b, c])
        assert_holds(data, acknowledged, gone=tail)


def test_replicas_agree_record_by_record_after_a_truncation_by_epoch(zookeeper_ensemble, tmp_path):
    """Every record its own offset (docs/architecture.md, "Offsets") on every replica: a
    leader dies with a tail of batched and compressed entries its follower lacks, the
    follower leads a new epoch and writes over those offsets, the old leader returns,
    truncates by epoch (its entry index cut with its log) and catches up. Then each of
    them, leading in turn, answers a fetch at every position and RECORD_COUNT between
    sampled positions the same, from records read once."""
    with LocalCluster(zookeeper_ensemble.connect_string, tmp_path, settings=BROKER_SETTINGS) as cluster, \
            zookeeper_client(zookeeper_ensemble.connect_string) as zk:
        cluster.start(2)
        a, b = create_replicated_topic(cluster, zk, TOPIC, partitions=1, replication_factor=2)[0]
        with BrokerConnection(*cluster.brokers[a].address) as conn:
            produce_mix(conn, TOPIC, rounds=2)
            pause_quietly(cluster, [b])
            producer_id = conn.init_producer_id().producer_id
            for i in range(3):  # a tail only A has: batches the follower never sees
                batch = encode_batch([(None, b"a-unreplicated-%d-%d" % (i, j), 1) for j in range(4)],
                                     BatchIdentity(producer_id, 0, 4 * i, 4), Codec.GZIP)
                conn.produce(TOPIC, 0, batch, acks=1)
        cluster.brokers[a].kill()
        cluster.brokers[b].resume()
        wait_for_state(zk, TOPIC, 0, lambda s: s.leader == b, f"{b} leading", timeout=60)
        wait_leading(cluster, b, TOPIC)
        with BrokerConnection(*cluster.brokers[b].address) as conn:
            produce_mix(conn, TOPIC, rounds=1)  # a new epoch over the offsets of A's tail
        cluster.start_broker(a)
        wait_for_state(zk, TOPIC, 0, lambda s: sorted(s.isr) == sorted([a, b]), f"{a} back in the ISR", timeout=60)
        wait_identical(cluster, TOPIC, 0, [a, b])
        with BrokerConnection(*cluster.brokers[b].address) as conn:
            records = every_record(conn, TOPIC)
            assert not [m for m in records if m.value.startswith(b"a-unreplicated")]
            check_every_offset(conn, TOPIC, records)
        cluster.brokers[b].stop()  # A leads: its answers must be the same
        wait_for_state(zk, TOPIC, 0, lambda s: s.leader == a, f"{a} leading", timeout=60)
        wait_leading(cluster, a, TOPIC)
        with BrokerConnection(*cluster.brokers[a].address) as conn:
            assert every_record(conn, TOPIC) == records
            check_every_offset(conn, TOPIC, records)
