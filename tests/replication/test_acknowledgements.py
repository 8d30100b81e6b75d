"""What an acks=-1 answer promises, under the moves that break it (docs/replication.md,
"What an acknowledgement promises"): an answer of success is bound to the leader epoch
of its append — leadership moving away and back inside the window between an append
and its commit waiter must not turn a truncated write into a success; a MULTIPRODUCE
answers each partition on its own, so one partition's failure is not every
partition's; and a broker without a ZooKeeper registration is kept out of the ISR."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from kazoo.recipe.watchers import DataWatch

from broker.client.connection import BrokerConnection
from broker.client.producer import Producer
from broker.common.errors import ErrorCode, LogbusError, NotLeaderForPartition
from broker.common.message import encode_message_set
from broker.common.protocol import ApiKey, ProducePart, ProduceRequest, ProduceResponse
from broker.common.zklayout import PartitionState, broker_path, partition_state_path
from harness.process import wait_until
from harness.proxy import TcpProxy
from tests.integration.brokerutil import connect, produce, read_partition
from tests.replication.faults import hold_commit_waits
from tests.replication.replicated import (
    create_replicated_topic, pause_quietly, segments, set_state, state, wait_identical, wait_isr, wait_leading,
)

FAST = {"log.flush.interval.ms": 20, "replica.fetch.wait.max.ms": 50, "zookeeper.session.timeout.ms": 2000}


def lead(cluster, zk, topic: str, broker_id: int, partition: int = 0) -> int:
    """Give `broker_id` the lead (a new epoch, same ISR) unless it has it; the epoch."""
    current = state(zk, topic, partition)
    if current.leader != broker_id:
        set_state(zk, topic, partition, PartitionState(broker_id, current.leader_epoch + 1, current.isr))
        wait_leading(cluster, broker_id, topic, partition)
    return state(zk, topic, partition).leader_epoch


def refuses_as_not_leader(cluster, broker_id: int, topic: str, partition: int = 0) -> bool:
    try:
        with BrokerConnection(*cluster.brokers[broker_id].address) as connection:
            connection.offsets(topic, partition, -1)
    except NotLeaderForPartition:
        return True
    except (LogbusError, OSError):
        pass
    return False


def holds(cluster, broker_id: int, topic: str, value: bytes) -> bool:
    return value in b"".join(data for _, data in segments(cluster, broker_id, topic))


def test_an_acks_all_write_truncated_while_leadership_moved_away_and_back_is_never_acknowledged(
        cluster, zk, tmp_path):
    """Bug 1 of issue 18, made certain: broker 0 appends a pipelined acks=-1 burst that
    a paused follower B lacks; the commit waiters are held (a hook) until leadership has
    moved to B — where 0 truncates the burst away — and 0 follows; then leadership comes
    back to 0 and more is written, so its high watermark passes the burst's offsets.
    Every success answered must be at its offset on every replica; the burst's answers
    are NotLeaderForPartition, at once, never a timeout."""
    gate = tmp_path / "hold-commit-waits"
    settings = {**FAST, "replica.lag.time.max.ms": 60_000}  # the paused follower stays in the ISR
    cluster.start_broker(0, settings, preamble=hold_commit_waits(str(gate)))
    for b in (1, 2):
        cluster.start_broker(b, settings)
    replicas = create_replicated_topic(cluster, zk, "pingpong")[0]
    epoch = lead(cluster, zk, "pingpong", 0)
    away = next(b for b in replicas if b != 0)
    burst = [b"burst %02d" % i for i in range(20)]
    with connect(cluster.brokers[0], timeout=120) as conn:
        produce(conn, "pingpong", 0, [b"committed"], acks=-1)
        gate.touch()
        pause_quietly(cluster, [away])
        try:
            bodies = [ProduceRequest(-1, 60_000, "pingpong", 0, encode_message_set([(None, v, 1000)])).encode()
                      for v in burst]
            conn.send_many([(ApiKey.PRODUCE, body, len(body)) for body in bodies])
            wait_until(lambda: holds(cluster, 0, "pingpong", burst[-1]), 30, "broker 0 to append the burst")
            isr = state(zk, "pingpong").isr
            set_state(zk, "pingpong", 0, PartitionState(away, epoch + 1, isr))
            wait_until(lambda: refuses_as_not_leader(cluster, 0, "pingpong"), 30, "broker 0 to stop leading")
        finally:
            cluster.brokers[away].resume()
        wait_leading(cluster, away, "pingpong")
        wait_until(lambda: not holds(cluster, 0, "pingpong", burst[-1]), 30, "broker 0 to truncate the burst away")
        gate.unlink()  # the held waiters start waiting now, on a broker that follows
        set_state(zk, "pingpong", 0, PartitionState(0, epoch + 2, isr))
        wait_leading(cluster, 0, "pingpong")
        with connect(cluster.brokers[0], timeout=120) as other:
            for i in range(30):
                produce(other, "pingpong", 0, [b"after %02d" % i], acks=-1)
        answers = []
        for value in burst:
            code, reader = conn.receive()
            answers.append((value, code, ProduceResponse.decode(reader).base_offset if code == ErrorCode.NONE else None))
        log = {m.offset: m.value for m in read_partition(conn, "pingpong", 0)}
    wait_identical(cluster, "pingpong", 0, replicas)
    acknowledged = [(value, offset) for value, code, offset in answers if code == ErrorCode.NONE]
    assert [(value, log.get(offset)) for value, offset in acknowledged] == [(v, v) for v, _ in acknowledged]
    assert [code for _, code, _ in answers] == [ErrorCode.NOT_LEADER_FOR_PARTITION] * len(burst)


def start_two_partitions_on_one_leader(cluster, zk) -> tuple[int, int]:
    """Brokers 0-2 with min.insync.replicas=2; topic `a` (RF 2) and `b` (RF 3), both
    led by one broker. Returns (the leader, a's other replica): pausing the latter
    leaves `a` one replica short and `b` two in sync."""
    for b in range(3):
        cluster.start_broker(b, {**FAST, "min.insync.replicas": 2, "replica.lag.time.max.ms": 1000})
    a = create_replicated_topic(cluster, zk, "a", replication_factor=2)[0]
    create_replicated_topic(cluster, zk, "b", replication_factor=3)
    lead(cluster, zk, "b", a[0])
    return a[0], a[1]


def test_multiproduce_answers_each_partition_on_its_own(cluster, zk):
    leader, other = start_two_partitions_on_one_leader(cluster, zk)
    with connect(cluster.brokers[leader], timeout=120) as conn:
        pause_quietly(cluster, [other])
        try:
            results = conn.multiproduce([ProducePart("a", 0, encode_message_set([(None, b"to a", 1000)])),
                                         ProducePart("b", 0, encode_message_set([(None, b"to b", 1000)]))],
                                        acks=-1, timeout_ms=60_000)
        finally:
            cluster.brokers[other].resume()
        assert [r.error_code for r in results] == [ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.NONE]
        assert [m.value for m in read_partition(conn, "b", 0)] == [b"to b"]


def test_a_producer_resends_only_the_batch_of_the_partition_that_failed(cluster, zk):
    """Both batches lingering, then flushed together: one MULTIPRODUCE to their leader."""
    leader, other = start_two_partitions_on_one_leader(cluster, zk)
    with Producer(zookeeper=cluster.zookeeper, acks=-1, mode="async", linger_ms=30_000, monitoring=False, retries=100,
                  retry_backoff_ms=100, delivery_timeout_ms=60_000, request_timeout_ms=60_000) as producer, \
            ThreadPoolExecutor(1) as flusher:
        pause_quietly(cluster, [other])
        try:
            sent = [producer.send("a", b"to a", partition=0), producer.send("b", b"to b", partition=0)]
            flushed = flusher.submit(producer.flush)
            wait_isr(zk, "a", {leader})  # the first attempt of `a` has failed (after its append)
        finally:
            cluster.brokers[other].resume()
        assert flushed.result(90).failed == []
        for future in sent:
            future.result(60)
    with connect(cluster.brokers[leader]) as conn:
        assert [m.value for m in read_partition(conn, "b", 0)] == [b"to b"]
        assert b"to a" in [m.value for m in read_partition(conn, "a", 0)]


def test_a_broker_whose_session_expired_stays_out_of_the_isr_until_it_registers_again(cluster, zk, zk_connect):
    """Cut one follower's link to ZooKeeper (a proxy) while it keeps fetching from the
    leader: once its session expires and the controller takes it out of the ISR, the
    leader must not add it back (its fetches still say it is caught up) until it has
    registered again (Kafka's KIP-841)."""
    servers, chroot = zk_connect.split("/", 1)
    with TcpProxy(_host_port(servers.split(",")[0])) as proxy:
        for b in (0, 1):
            cluster.start_broker(b, FAST)
        cluster.start_broker(2, FAST, zookeeper=f"{proxy.address}/{chroot}")
        create_replicated_topic(cluster, zk, "cutoff")
        lead(cluster, zk, "cutoff", 0)
        seen: list[list[int]] = []
        DataWatch(zk, partition_state_path("cutoff", 0),
                  lambda data, stat: data is not None and seen.append(PartitionState.decode(data).isr))
        with connect(cluster.brokers[0], timeout=60) as conn:
            produce(conn, "cutoff", 0, [b"before"], acks=-1)
            cut_at = len(seen)
            proxy.cut()
            wait_until(lambda: not zk.exists(broker_path(2)), 30, "broker 2's session to expire")
            wait_isr(zk, "cutoff", {0, 1})
            for i in range(40):  # the cut-off follower keeps fetching these
                produce(conn, "cutoff", 0, [b"while cut %02d" % i], acks=-1)
            wait_until(lambda: holds(cluster, 2, "cutoff", b"while cut 39"), 30, "broker 2 to replicate while cut")
            since_cut = seen[cut_at:]
            removed = next(i for i, isr in enumerate(since_cut) if 2 not in isr)
            assert [isr for isr in since_cut[removed:] if 2 in isr] == []
            assert 2 not in state(zk, "cutoff").isr
            proxy.restore()
            wait_until(lambda: zk.exists(broker_path(2)), 60, "broker 2 to register again")
            wait_isr(zk, "cutoff", {0, 1, 2})
    with connect(cluster.brokers[0]) as conn:
        values = Counter(m.value for m in read_partition(conn, "cutoff", 0))
    assert values == Counter([b"before"] + [b"while cut %02d" % i for i in range(40)])


def _host_port(server: str) -> tuple[str, int]:
    host, port = server.rsplit(":", 1)
    return host, int(port)
