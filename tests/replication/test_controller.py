"""The controller with real brokers and ZooKeeper: one broker wins `/controller`, a
killed controller is replaced, a killed leader's partitions move to an ISR member with
the next leader epoch, a returning broker does not take leadership back until it is
in sync and the leader rebalance hands it over, a leader that was down with the whole
cluster leads a new epoch, and without a live ISR member a partition goes offline
unless unclean election is on (broker/server/controller.py, broker/server/election.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from broker.client.connection import BrokerConnection
from broker.client.producer import Producer
from broker.common.errors import InvalidReplicationFactor
from broker.common.protocol import AUTO_PARTITIONS
from broker.common.zklayout import (
    BROKER_IDS, CONTROLLER_EPOCH, PartitionState, broker_path, create_topic, partition_state_path, read_assignment,
    read_partition_state,
)
from broker.server.controller import read_controller
from harness.cluster import LocalCluster
from harness.process import wait_until
from tests.integration.clientutil import read_topic

LOGBUS = Path(sys.executable).parent / "logbus"
SESSION_MS = 3000
SETTINGS = {"zookeeper.session.timeout.ms": SESSION_MS, "log.flush.interval.ms": 20}
MOVE_S = 60  # the session timeout plus a controller pass, with room for a loaded machine


def logbus(zk_connect: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOGBUS_ZOOKEEPER": zk_connect}
    return subprocess.run([str(LOGBUS), *args], capture_output=True, text=True, env=env, timeout=120)


def states(zk: KazooClient, topic: str) -> dict[int, PartitionState]:
    zk.sync("/")  # as the ZooKeeper leader has them: the test's server may lag a broker's
    return {p: read_partition_state(zk, topic, p)[0] for p in read_assignment(zk, topic)}


def controller_other_than(zk: KazooClient, broker_id: int | None) -> tuple[int] | None:
    """(the controller's id,) if there is one and it is not `broker_id` (a tuple: 0 is an id)."""
    current = zk.retry(read_controller, zk)
    return (current,) if current is not None and current != broker_id else None


def controller_epoch(zk: KazooClient) -> int:
    return int(zk.get(CONTROLLER_EPOCH)[0])


def describe_rows(zk_connect: str, topic: str) -> dict[int, dict[str, str]]:
    result = logbus(zk_connect, "topics", "--describe", topic)
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.strip().splitlines()
    names = header.split("\t")
    return {int(r["partition"]): r for r in (dict(zip(names, row.split("\t"))) for row in rows)}


def test_controller_failover_moves_the_dead_brokers_leaderships_to_the_isr(zookeeper_ensemble, tmp_path):
    """Kill -9 the broker that is both the controller and a leader, and stop a
    ZooKeeper server meanwhile: another broker becomes controller with a higher
    controller epoch, every partition the dead broker led gets the first live ISR
    member as leader with leader_epoch + 1, and the dead broker leaves every ISR.
    When it comes back it leads nothing."""
    ensemble = zookeeper_ensemble
    connect = ensemble.connect_string
    zk = KazooClient(connect, connection_retry={"max_tries": -1, "max_delay": 1})
    zk.start(30)
    with LocalCluster(connect, tmp_path, SETTINGS) as cluster:
        try:
            cluster.start(3)
            result = logbus(connect, "topics", "--create", "events", "--partitions", "6", "--replication-factor", "3")
            assert result.returncode == 0, result.stderr
            first = wait_until(lambda: controller_other_than(zk, None), 30, "a controller")[0]
            first_epoch = controller_epoch(zk)
            before = states(zk, "events")
            replicas = read_assignment(zk, "events")
            led = sorted(p for p, s in before.items() if s.leader == first)
            assert len(led) == 2 and all(s.isr == replicas[p] for p, s in before.items())

            follower_zk = next(i for i, s in enumerate(ensemble.servers) if s.mode == "follower")
            ensemble.stop_server(follower_zk)
            cluster.brokers[first].kill()

            second = wait_until(lambda: controller_other_than(zk, first), MOVE_S,
                                "another broker to become the controller")[0]
            wait_until(lambda: zk.retry(controller_epoch, zk) > first_epoch, MOVE_S, "a new controller epoch")
            wait_until(lambda: all(first not in s.isr for s in zk.retry(states, zk, "events").values()), MOVE_S,
                       f"broker {first} to leave every ISR")
            after = zk.retry(states, zk, "events")
            for p, old in before.items():
                new = after[p]
                if p in led:
                    expected = [b for b in replicas[p] if b != first][0]
                    assert (new.leader, new.leader_epoch) == (expected, old.leader_epoch + 1), (p, old, new)
                else:
                    assert (new.leader, new.leader_epoch) == (old.leader, old.leader_epoch), (p, old, new)
                assert new.isr == [b for b in old.isr if b != first]
                assert new.controller_epoch > first_epoch

            ensemble.start_server(follower_zk)
            rows = describe_rows(connect, "events")
            for p in led:
                assert rows[p]["status"] == "available" and rows[p]["epoch"] == str(before[p].leader_epoch + 1)
                assert first not in map(int, rows[p]["isr"].split(","))

            live = next(b for b in cluster.brokers.values() if b.broker_id != first)
            expected = {p: (s.leader, s.leader_epoch, s.isr) for p, s in after.items()}
            with BrokerConnection(*live.address, timeout=30) as conn:  # METADATA v1 carries the same state
                # once its watched cache has caught up with ZooKeeper: a moment behind it, under load
                shown = lambda: {m.partition: (m.leader, m.leader_epoch, m.isr)  # noqa: E731
                                 for m in conn.metadata(["events"]).topics[0].partitions}
                wait_until(lambda: shown() == expected, MOVE_S, "the broker's metadata to show ZooKeeper's state")
                v0 = conn.metadata(["events"], version=0).topics[0].partitions
                assert [p.leader for p in v0] == [after[p.partition].leader for p in v0]

            cluster.start_broker(first)  # comes back: a follower, not a leader
            wait_until(lambda: f"controller: broker {first} is live" in cluster.brokers[second].log_tail(400), MOVE_S,
                       f"the controller to see broker {first} again")
            assert {p: s.leader for p, s in zk.retry(states, zk, "events").items()} == \
                {p: s.leader for p, s in after.items()}
        finally:
            zk.stop()
            zk.close()


@pytest.mark.parametrize("unclean", [False, True], ids=["clean", "unclean"])
def test_with_only_an_out_of_sync_replica_left(cluster, zk, zk_connect, unclean):
    """Replicas 0 and 1; "early" messages reach both; the follower dies (the controller
    drops it from the ISR) and "late" messages are acknowledged by the leader alone;
    then the leader dies. When only the out-of-sync follower returns, the partition
    stays OFFLINE until the leader returns, and nothing is lost — unless unclean
    election is on: then the follower leads at once, alone in its ISR, the controller
    says at WARNING what that loses, and the late messages are gone (the documented
    cost, docs/controller.md)."""
    settings = {**SETTINGS, "unclean.leader.election.enable": str(unclean).lower()}
    for broker_id in (0, 1):
        cluster.start_broker(broker_id, settings)
    create_topic(zk, "lonely", 1, replication_factor=2)
    wait_until(lambda: read_controller(zk) is not None, 30, "a controller")
    initial = states(zk, "lonely")[0]
    leader = initial.leader
    follower = 1 - leader
    early, late = [b"early-%d" % i for i in range(20)], [b"late-%d" % i for i in range(20)]
    with Producer(zookeeper=zk_connect, acks=-1, monitoring=False, retries=50, retry_backoff_ms=200) as producer:
        for value in early:
            producer.send("lonely", value, partition=0)

        cluster.brokers[follower].kill()
        wait_until(lambda: states(zk, "lonely")[0].isr == [leader], MOVE_S, f"broker {follower} to leave the ISR")
        for value in late:
            producer.send("lonely", value, partition=0)
    cluster.brokers[leader].kill()
    wait_until(lambda: zk.exists(f"/brokers/ids/{leader}") is None, MOVE_S, f"broker {leader}'s session to expire")
    cluster.start_broker(follower)
    returned = cluster.brokers[follower]
    wait_until(lambda: "is the controller" in returned.log_tail(400), MOVE_S, f"broker {follower} to take control")

    if unclean:
        state = wait_until(lambda: (s := states(zk, "lonely")[0]).leader == follower and s, MOVE_S,
                           "the out-of-sync replica to lead")
        assert state.isr == [follower] and state.leader_epoch == initial.leader_epoch + 1
        # the controller logs after its write succeeded: the line may trail the state node
        wait_until(lambda: "WARNING" in (tail := returned.log_tail(400)) and "UNCLEAN election of lonely-0" in tail,
                   MOVE_S, "the controller's warning of the unclean election")
        assert describe_rows(zk_connect, "lonely")[0]["status"] == "available"
        assert [m.value for m in read_topic(zk_connect, "lonely")[0]] == early  # the late ones are lost
    else:
        state = wait_until(lambda: (s := states(zk, "lonely")[0]).leader == -1 and s, MOVE_S, "the partition offline")
        assert state.isr == [leader] and state.leader_epoch == initial.leader_epoch + 1
        row = describe_rows(zk_connect, "lonely")[0]
        assert (row["status"], row["leader"]) == ("OFFLINE", "-1")
        wait_until(lambda: "lonely-0 is OFFLINE" in returned.log_tail(400), MOVE_S, "the controller's OFFLINE warning")

        cluster.start_broker(leader)  # the last ISR member returns: it leads again, with everything
        state = wait_until(lambda: (s := states(zk, "lonely")[0]).leader == leader and s, MOVE_S,
                           "the last ISR member to lead again")
        assert state.leader_epoch == initial.leader_epoch + 2
        values = wait_until(lambda: (v := [m.value for m in read_topic(zk_connect, "lonely")[0]]) == early + late and v,
                            MOVE_S, "every acknowledged message")
        assert values == early + late


def test_a_controller_whose_session_expires_is_replaced_and_steps_down(cluster, zk):
    """SIGSTOP the controller past its session timeout: another broker takes over with
    a higher epoch; the resumed broker notices its session is gone and is no longer
    the controller; the new one moves leaderships when a broker dies."""
    for broker_id in range(3):
        cluster.start_broker(broker_id, SETTINGS)
    create_topic(zk, "paused", 3, replication_factor=2)
    first = wait_until(lambda: controller_other_than(zk, None), 30, "a controller")[0]
    first_epoch = wait_until(lambda: controller_epoch(zk), 30, "the controller epoch")

    cluster.brokers[first].pause()
    try:
        second = wait_until(lambda: controller_other_than(zk, first), MOVE_S, "a new controller")[0]
        wait_until(lambda: controller_epoch(zk) > first_epoch, MOVE_S, "a new controller epoch")
    finally:
        cluster.brokers[first].resume()
    wait_until(lambda: "no longer the controller" in cluster.brokers[first].log_tail(400), MOVE_S,
               f"broker {first} to step down")
    assert controller_other_than(zk, None) == (second,)

    victim = next(b for b in range(3) if b not in (first, second))
    before = states(zk, "paused")
    led = [p for p, s in before.items() if s.leader == victim]
    cluster.brokers[victim].kill()
    wait_until(lambda: all(s.leader != victim for s in states(zk, "paused").values()), MOVE_S,
               f"broker {victim}'s partitions to move (or go offline: the paused broker left their ISRs)")
    assert all(states(zk, "paused")[p].leader_epoch == before[p].leader_epoch + 1 for p in led)
    assert f"controller: broker {victim} is gone" in cluster.brokers[second].log_tail(400)


def test_create_topic_replication_factor_and_its_default(cluster, zk):
    """CREATE_TOPIC's replication factor: 0 or -1 and auto-creation take
    `default.replication.factor`; more replicas than live brokers is refused."""
    settings = {**SETTINGS, "default.replication.factor": 2, "num.partitions": 3}
    for broker_id in range(2):
        cluster.start_broker(broker_id, settings)
    with BrokerConnection(*cluster.brokers[0].address, timeout=30) as conn:
        conn.create_topic("explicit", 2, replication_factor=1)
        conn.create_topic("defaulted", 2, replication_factor=0)
        conn.create_topic("auto", AUTO_PARTITIONS)
        with pytest.raises(InvalidReplicationFactor, match=r"replication factor 3 .*1..2 \(the number of live brokers"):
            conn.create_topic("wide", 1, replication_factor=3)
        with pytest.raises(InvalidReplicationFactor):
            conn.create_topic("negative", 1, replication_factor=-2)
    assert [len(r) for r in read_assignment(zk, "explicit").values()] == [1, 1]
    assert [len(r) for r in read_assignment(zk, "defaulted").values()] == [2, 2]
    assert [len(set(r)) for r in read_assignment(zk, "auto").values()] == [2, 2, 2]
    assert read_assignment(zk, "wide") is None


def test_a_leader_back_first_after_the_whole_cluster_died_leads_a_new_epoch(cluster, zk, zk_connect):
    """The case a controller's snapshot of registrations cannot catch: every broker dies,
    and the leader comes back first and becomes the controller with no earlier view.
    The state node still names it leader of epoch E, written before its registration:
    it must not lead E again — it may have lost E's tail (KIP-101), and a follower with
    more of E would then truncate to it — but a new epoch, recorded in its log."""
    for broker_id in range(3):
        cluster.start_broker(broker_id, SETTINGS)
    create_topic(zk, "restart", 1, replication_factor=3)
    initial = states(zk, "restart")[0]
    leader = initial.leader
    before, after = [b"before-%d" % i for i in range(10)], [b"after-%d" % i for i in range(10)]
    with Producer(zookeeper=zk_connect, acks=-1, monitoring=False, retries=50, retry_backoff_ms=200) as producer:
        for value in before:
            producer.send("restart", value, partition=0)
    cluster.kill_all()  # at once: no survivor's controller moves the lead meanwhile

    cluster.start_broker(leader)
    state = wait_until(lambda: (s := states(zk, "restart")[0]).leader == leader and s.leader_epoch > initial.leader_epoch
                       and s, MOVE_S, f"broker {leader} to lead a new epoch")
    assert state.isr == [leader]
    with Producer(zookeeper=zk_connect, acks=1, monitoring=False, retries=50, retry_backoff_ms=200) as producer:
        end = producer.send("restart", after[0], partition=0).offset
        for value in after[1:]:
            producer.send("restart", value, partition=0)
    checkpoint = (cluster.brokers[leader].log_dir / "restart-0" / "leader-epoch-checkpoint").read_text().split("\n")
    assert checkpoint[-2] == f"{state.leader_epoch} {end}"  # the new epoch starts where the old data ends
    values = wait_until(lambda: (v := [m.value for m in read_topic(zk_connect, "restart")[0]]) == before + after
                        and v, MOVE_S, "every message, once flushed (acks=1 answers before the flush)")
    assert values == before + after
    assert "predates its registration" in cluster.brokers[leader].log_tail(400)


def test_a_leader_back_first_waits_out_the_lingering_sessions_of_the_dead(cluster, zk, zk_connect):
    """The same restart, but ZooKeeper has not yet expired the other brokers' sessions
    when the leader takes over as controller: their registrations look live. Handing
    the leadership to one of them (and cutting the restarted leader from the ISR) would
    leave the partition offline for good once those sessions expire — an ISR of dead
    brokers. The new controller must wait out a session timeout before trusting a
    registration older than its takeover. The lingering sessions are made by the test
    (a dead broker's session cannot be timed), with the registrations the brokers wrote."""
    for broker_id in range(3):
        cluster.start_broker(broker_id, SETTINGS)
    create_topic(zk, "lingering", 1, replication_factor=3)
    initial = states(zk, "lingering")[0]
    leader = initial.leader
    others = [b for b in range(3) if b != leader]
    registrations = {b: zk.get(broker_path(b))[0] for b in others}
    before = [b"before-%d" % i for i in range(10)]
    with Producer(zookeeper=zk_connect, acks=-1, monitoring=False, retries=50, retry_backoff_ms=200) as producer:
        for value in before:
            producer.send("lingering", value, partition=0)
    cluster.kill_all()
    wait_until(lambda: not zk.get_children(BROKER_IDS) and read_controller(zk) is None, MOVE_S,
               "the killed brokers' sessions to expire")

    lingering = KazooClient(zk_connect, timeout=SESSION_MS / 1000)
    lingering.start(30)
    try:
        for broker_id, data in registrations.items():
            lingering.create(broker_path(broker_id), data, ephemeral=True)
        state_path = partition_state_path("lingering", 0)
        zk.set(state_path, zk.get(state_path)[0])  # as it was: last written after their registrations
        cluster.start_broker(leader, SETTINGS)
        wait_until(lambda: read_controller(zk) == leader and (
            states(zk, "lingering")[0].leader != leader
            or "may be a dead broker's lingering session" in cluster.brokers[leader].log_tail(200)),
            MOVE_S, f"broker {leader}'s controller to decide the partition")
    finally:
        lingering.stop()  # the sessions end, as a dead broker's expires
        lingering.close()
    state = wait_until(lambda: (s := states(zk, "lingering")[0]).leader == leader
                       and s.leader_epoch > initial.leader_epoch and s, MOVE_S, f"broker {leader} to lead a new epoch")
    assert state.isr == [leader]
    assert [m.value for m in read_topic(zk_connect, "lingering")[0]] == before


def test_a_leader_killed_and_back_soon_after_a_takeover_hands_its_partition_to_the_controller_at_once(
        cluster, zk, zk_connect):
    """The grace above distrusts registrations older than the takeover, but never the
    controller's own: its session is live. A leader killed -9 and back within the grace
    loses its partition to the controller's broker in the same pass, not after the
    grace; a grace that distrusted the controller too logs that it waits for it. The
    controller is paused meanwhile, so that it sees the leader re-registered (live, but
    unfit) rather than gone; its long session (a grace of 20 s) outlasts the pause."""
    cluster.start_broker(0, {**SETTINGS, "zookeeper.session.timeout.ms": 10_000})
    wait_until(lambda: read_controller(zk) == 0, MOVE_S, "broker 0 to be the controller")
    cluster.start_broker(1, {**SETTINGS, "zookeeper.session.timeout.ms": 1000})
    create_topic(zk, "soon", 2, replication_factor=2)
    initial = wait_until(lambda: (s := states(zk, "soon")) and all(len(p.isr) == 2 for p in s.values()) and s,
                         MOVE_S, "both partitions with both replicas in sync")
    partition, led = next((p, s) for p, s in initial.items() if s.leader == 1)
    registered = zk.get(broker_path(1))[1].czxid
    cluster.brokers[0].pause()
    try:
        cluster.brokers[1].kill()
        cluster.brokers[1].start(wait=False)
        wait_until(lambda: (stat := zk.exists(broker_path(1))) and stat.czxid != registered, MOVE_S,
                   "broker 1 to register again")
    finally:
        cluster.brokers[0].resume()
    state = wait_until(lambda: (s := states(zk, "soon")[partition]).leader_epoch > led.leader_epoch and s, MOVE_S,
                       "the restarted leader's partition to move")
    assert state.leader == 0
    assert "broker 0's registration predates this takeover" not in cluster.brokers[0].log_tail(400)


def test_leaderships_go_back_to_the_preferred_replicas_once_they_are_in_sync(cluster, zk, zk_connect):
    """auto.leader.rebalance.enable: a killed broker's leaderships move to the others;
    once it is back and in the ISR again, the controller hands each back to it, in a new
    epoch, and every acknowledged message is still there — instead of leaving the
    survivors to lead everything after a rolling restart."""
    settings = {**SETTINGS, "leader.imbalance.check.interval.seconds": 1}
    for broker_id in range(3):
        cluster.start_broker(broker_id, settings)
    assignment = create_topic(zk, "balanced", 3, replication_factor=3)
    victim = assignment[0][0]
    sent = {p: [] for p in assignment}

    def send(label: str) -> None:
        with Producer(zookeeper=zk_connect, acks=-1, monitoring=False, retries=50, retry_backoff_ms=200) as producer:
            for partition in assignment:
                for i in range(10):
                    value = b"%s-%d-%d" % (label.encode(), partition, i)
                    producer.send("balanced", value, partition=partition)
                    sent[partition].append(value)

    send("before")
    cluster.brokers[victim].kill()
    moved = wait_until(lambda: (s := states(zk, "balanced")) and all(x.leader not in (victim, -1) for x in s.values())
                       and s, MOVE_S, f"broker {victim}'s leaderships to move")
    send("while-down")
    cluster.start_broker(victim)
    back = wait_until(lambda: (s := states(zk, "balanced")) and all(
        s[p].leader == replicas[0] and sorted(s[p].isr) == sorted(replicas) for p, replicas in assignment.items())
        and s, MOVE_S, "every partition led by its preferred replica, with a full ISR")
    led_by_victim = [p for p, replicas in assignment.items() if replicas[0] == victim]
    assert led_by_victim and all(back[p].leader_epoch > moved[p].leader_epoch for p in led_by_victim)
    send("after")
    read = wait_until(lambda: (r := read_topic(zk_connect, "balanced")) and all(
        [m.value for m in r.get(p, [])] == sent[p] for p in assignment) and r, MOVE_S, "every acknowledged message")
    assert {p: [m.value for m in read[p]] for p in assignment} == sent
    logs = "".join(broker.log_tail(2000) for broker in cluster.brokers.values())
    assert "(leader rebalance)" in logs
