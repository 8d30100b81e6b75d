"""The cluster's ZooKeeper root attacked (issue 34): an anonymous ZooKeeper client tried
to replace the controller's node, delete the producer-id block and the other nodes the
cluster keeps at its root, and create nodes of its own there. On a secured cluster its
root is the cluster's own (a chroot only the cluster's digest may change); on any
cluster a foreign `/controller` cannot keep it without a controller and a lost
producer-id block hands no id out twice. Real brokers and ZooKeeper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import OPEN_ACL_UNSAFE

from broker.client.connection import BrokerConnection
from broker.client.consumer import SimpleConsumer
from broker.client.producer import Producer
from broker.common.acls import Operation, ResourceType
from broker.common.produceridblocks import claim_producer_id_block
from broker.common.zklayout import (
    ACLS, BROKER_TOPICS, CONTROLLER, CONTROLLER_EPOCH, PRODUCER_ID_BLOCK, USERS, broker_path,
    create_topic, decode_controller, encode_controller, read_assignment, read_partition_state,
)
from broker.server.controllernode import foreign_controller_node
from harness.cluster import LocalCluster
from harness.process import wait_until
from harness.secured import ZOOKEEPER_AUTH, SecuredCluster
from harness.zookeeper import ZooKeeperServer, client

pytestmark = pytest.mark.slow
LOGBUS = Path(sys.executable).parent / "logbus"
SESSION_MS = 3000
MOVE_S = 60  # a session timeout and a controller pass, with room for a loaded machine
ROOT_NODES = [CONTROLLER, CONTROLLER_EPOCH, "/brokers", ACLS, USERS, PRODUCER_ID_BLOCK]
SECURED = {"zookeeper.session.timeout.ms": SESSION_MS, "zookeeper.set.acl": "true", "zookeeper.auth": ZOOKEEPER_AUTH}


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    work = tmp_path_factory.mktemp("secured-root")
    with ZooKeeperServer(work / "zookeeper") as zookeeper:
        cluster = SecuredCluster(work, zookeeper, settings={"zookeeper.session.timeout.ms": SESSION_MS})
        try:
            cluster.start(3)
            yield cluster
        finally:
            cluster.stop()


def admin(secured: SecuredCluster, broker_id: int) -> BrokerConnection:
    return BrokerConnection(*secured.address(broker_id, "CLIENT"), security=secured.scram("admin", "admin-secret"),
                            timeout=20).connect()


def producer_ids(connect, count: int = 3) -> list[int]:
    """`count` ids from INIT_PRODUCER_ID on the connection `connect()` opens."""
    with connect() as conn:
        return [conn.init_producer_id().producer_id for _ in range(count)]


def live_controller(zk: KazooClient) -> int | None:
    """The controller's broker id if `/controller` is the ephemeral node of that
    broker's registered session, else None."""
    try:
        data, stat = zk.get(CONTROLLER)
        registration = zk.exists(broker_path(decode_controller(data)))
    except (NoNodeError, ValueError, KeyError):
        return None
    owned = registration is not None and stat.ephemeralOwner == registration.ephemeralOwner != 0
    return decode_controller(data) if owned else None


def replace_controller(zk: KazooClient) -> list:
    """The attack: in one transaction, the ephemeral `/controller` deleted and a
    persistent one naming broker 99 created in its place. The transaction's results."""
    transaction = zk.transaction()
    transaction.delete(CONTROLLER)
    transaction.create(CONTROLLER, encode_controller(99))
    return transaction.commit()


def led_by(zk: KazooClient, topic: str, brokers: set[int]) -> bool:
    zk.sync("/")
    return all(read_partition_state(zk, topic, p).state.leader in brokers for p in read_assignment(zk, topic))


def block_end(zk: KazooClient) -> int:
    return int(json.loads(zk.get(PRODUCER_ID_BLOCK)[0])["block_end"])


def logbus(connect: str, work: Path, *args: str) -> subprocess.CompletedProcess:
    """`logbus --zookeeper connect ...` as an operator runs it, with the cluster's identity."""
    config = work / "admin.properties"
    config.write_text(f"zookeeper.auth={ZOOKEEPER_AUTH}\nzookeeper.set.acl=true\n")
    config.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "LOGBUS_ZOOKEEPER"}
    return subprocess.run([str(LOGBUS), "--zookeeper", connect, "--command-config", str(config), *args],
                          capture_output=True, text=True, env=env, timeout=120)


# --------------------------------------------------------------- a secured cluster


@pytest.mark.parametrize("path", ROOT_NODES)
def test_an_anonymous_client_cannot_delete_a_root_level_node(secured, path):
    producer_ids(lambda: admin(secured, 0), 1)  # the producer-id block exists
    with client(secured.connect_string) as anonymous:
        assert anonymous.exists(path), path
        with pytest.raises(NoAuthError):
            anonymous.delete(path)
    assert secured.admin_zk.exists(path)


def test_an_anonymous_client_cannot_create_a_node_at_the_root(secured):
    with client(secured.connect_string) as anonymous:
        with pytest.raises(NoAuthError):
            anonymous.create(f"/intruder-{uuid.uuid4().hex[:6]}", b"mine")
        with pytest.raises(NoAuthError):
            anonymous.set_acls("/", OPEN_ACL_UNSAFE)


def test_the_controller_node_cannot_be_replaced_and_a_killed_controller_is_replaced(secured):
    """The finding: the ephemeral `/controller` replaced by a persistent `{"broker_id":
    99}`, then the controller killed -9 — 26 s later nobody had taken over and produces
    got NotLeaderForPartition. The replace is refused now; a new controller follows
    the kill and re-leads the dead broker's partitions."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with admin(secured, 0) as conn:
        conn.create_topic(topic, 3, 3)
    zk = secured.admin_zk
    wait_until(lambda: read_assignment(zk, topic) and led_by(zk, topic, {0, 1, 2}), 30, f"{topic} to have leaders")
    wait_until(lambda: live_controller(zk) is not None, 30, "a controller")
    controller = live_controller(zk)
    owner = zk.get(CONTROLLER)[1].ephemeralOwner
    with client(secured.connect_string) as anonymous:
        results = replace_controller(anonymous)
    assert any(isinstance(r, NoAuthError) for r in results), results
    assert zk.get(CONTROLLER)[1].ephemeralOwner == owner
    secured.cluster.brokers[controller].kill()
    try:
        live = {0, 1, 2} - {controller}
        wait_until(lambda: live_controller(zk) in live, MOVE_S, "a live broker to take the controller over")
        wait_until(lambda: led_by(zk, topic, live), MOVE_S, f"{topic} to be led by live brokers only")
    finally:
        secured.start_broker(controller)


def test_an_anonymous_client_cannot_delete_the_producer_id_block(secured):
    producer_ids(lambda: admin(secured, 0), 1)
    with client(secured.connect_string) as anonymous:
        with pytest.raises(NoAuthError):
            anonymous.delete(PRODUCER_ID_BLOCK)


def test_a_producer_id_block_deleted_by_the_clusters_own_identity_hands_no_id_out_twice(secured):
    """Who holds the digest can still lose the block node: the next block must start
    above every id handed out before (a restarted broker claims a fresh block)."""
    before = producer_ids(lambda: admin(secured, 0)) + producer_ids(lambda: admin(secured, 1))
    handed_out = block_end(secured.admin_zk)  # every id given so far is below it
    secured.admin_zk.delete(PRODUCER_ID_BLOCK)
    secured.cluster.brokers[1].stop()
    secured.start_broker(1)
    after = producer_ids(lambda: admin(secured, 1)) + producer_ids(lambda: admin(secured, 2))
    assert not set(before) & set(after), (before, after)
    assert min(after) >= handed_out, (handed_out, after)


# ------------------------------------------------------------- an unsecured cluster


def test_a_persistent_foreign_controller_node_does_not_stop_an_election(cluster, zk):
    """Without ZooKeeper ACLs anyone may replace `/controller`; the election must
    still go on once the controller dies, and the foreign node is reported."""
    for broker_id in (0, 1):
        cluster.start_broker(broker_id, {"zookeeper.session.timeout.ms": SESSION_MS})
    create_topic(zk, "events", 2, 2)
    wait_until(lambda: led_by(zk, "events", {0, 1}), 30, "events to have leaders")
    wait_until(lambda: live_controller(zk) is not None, 30, "a controller")
    controller = live_controller(zk)
    marks = {broker: broker.log_size() for broker in cluster.brokers.values()}
    results = replace_controller(zk)
    assert not any(isinstance(r, Exception) for r in results), results  # an open ZooKeeper lets it happen
    # reported before the kill: a controller killed between deleting the node and
    # logging it would leave no line to find
    wait_until(lambda: any(broker.logged_since(mark, "/controller is not a live broker's")
                           for broker, mark in marks.items()), MOVE_S, "a broker to report the foreign /controller")
    survivor = 1 - controller
    cluster.brokers[controller].kill()
    wait_until(lambda: live_controller(zk) == survivor, MOVE_S, f"broker {survivor} to become the controller")
    wait_until(lambda: led_by(zk, "events", {survivor}), MOVE_S, f"events to be led by broker {survivor}")
    assert zk.get(CONTROLLER)[1].ephemeralOwner != 0


def test_an_anonymously_deleted_producer_id_block_hands_no_id_out_twice(cluster, zk):
    """The finding: `/latest_producer_id_block` deleted, the next block started at 0
    again and producer id 0 was handed out a second time."""
    for broker_id in (0, 1):
        cluster.start_broker(broker_id)
    before = producer_ids(lambda: BrokerConnection(*cluster.brokers[0].address).connect())
    handed_out = block_end(zk)
    zk.delete(PRODUCER_ID_BLOCK)
    after = producer_ids(lambda: BrokerConnection(*cluster.brokers[1].address).connect())
    assert not set(before) & set(after), (before, after)
    assert min(after) >= handed_out, (handed_out, after)


def test_producer_id_blocks_only_grow_whatever_becomes_of_the_node(zk):
    """Each claim starts above every block claimed before it, with the node there,
    deleted, or rewritten to say that nothing was handed out yet."""
    blocks = [claim_producer_id_block(zk, 0), claim_producer_id_block(zk, 1)]
    zk.delete(PRODUCER_ID_BLOCK)
    blocks.append(claim_producer_id_block(zk, 1))
    zk.set(PRODUCER_ID_BLOCK, json.dumps({"broker": 9, "block_start": 0, "block_end": 0}).encode())
    blocks.append(claim_producer_id_block(zk, 0))
    zk.set(PRODUCER_ID_BLOCK, b"garbage")
    blocks.append(claim_producer_id_block(zk, 0))
    assert all(end - start == 1000 for start, end in blocks)
    assert all(earlier[1] <= later[0] for earlier, later in zip(blocks, blocks[1:])), blocks


def test_only_a_registered_brokers_own_ephemeral_node_is_the_controllers(zk, zk_connect):
    zk.ensure_path("/brokers/ids")
    zk.create(broker_path(1), b"{}", ephemeral=True)
    with client(zk_connect) as stranger:
        verdicts = {}
        for name, owner, data in (("ours", zk, encode_controller(1)), ("another session's", stranger,
                                  encode_controller(1)), ("unregistered", zk, encode_controller(7)),
                                  ("unreadable", zk, b"not json")):
            owner.create(CONTROLLER, data, ephemeral=True)
            verdicts[name] = foreign_controller_node(zk, *zk.get(CONTROLLER))
            owner.delete(CONTROLLER)
        zk.create(CONTROLLER, encode_controller(1))
        verdicts["persistent"] = foreign_controller_node(zk, *zk.get(CONTROLLER))
    assert verdicts.pop("ours") is None
    assert all(verdicts.values()), verdicts


# ---------------------------------------------------------------- moving a cluster


def test_a_broker_protects_an_open_chroot_it_starts_under(cluster, zk):
    """A chroot made beforehand with ZooKeeper's default ACL (world: all), as `zkCli
    create /logbus` or the tests' own chroots make it: the first secured broker to start
    makes it the cluster's."""
    cluster.start_broker(0, SECURED)
    wait_until(lambda: zk.exists(CONTROLLER_EPOCH), 30, "the controller's epoch")
    with pytest.raises(NoAuthError):
        zk.create("/intruder", b"mine")
    with pytest.raises(NoAuthError):
        zk.delete(CONTROLLER_EPOCH)
    assert "now only the cluster's identity may" in cluster.brokers[0].log_tail(400)


def test_the_command_protects_an_open_chroot(zk, zk_connect, tmp_path):
    result = logbus(zk_connect, tmp_path, "zookeeper", "protect-root")
    assert result.returncode == 0, result.stderr
    with pytest.raises(NoAuthError):
        zk.create("/intruder", b"mine")
    assert logbus(zk_connect, tmp_path, "zookeeper", "protect-root").returncode == 0  # once more: nothing to do


@pytest.mark.parametrize("where, config, says", [
    ("", True, "chroot"),
    ("/chroot", False, "zookeeper.auth"),
])
def test_the_command_refuses_what_it_cannot_protect(zookeeper, tmp_path, where, config, says):
    connect = zookeeper.connect_string + where
    result = logbus(connect, tmp_path, "zookeeper", "protect-root") if config else subprocess.run(
        [str(LOGBUS), "--zookeeper", connect, "zookeeper", "protect-root"], capture_output=True, text=True,
        timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and says in result.stderr, result.stderr


def test_a_secured_cluster_at_the_zookeeper_root_moves_under_a_protected_chroot(tmp_path):
    """A secured cluster as the harness made it before issue 34 — its nodes at
    ZooKeeper's own root, which anyone may change — is stopped, copied under a chroot
    by `logbus zookeeper protect-root --copy-from /`, and started there: its topics,
    data, users, ACLs and producer ids carry over, and the attacks are refused."""
    with ZooKeeperServer(tmp_path / "zookeeper") as zookeeper:
        old = SecuredCluster(tmp_path, zookeeper, chroot="")
        try:
            old.start(1)
            assert "ZooKeeper's own root" in old.cluster.brokers[0].log_tail(400)  # warned, naming the fix
            old.add_user("erin", "erin-secret")
            old.allow("User:erin", Operation.READ, ResourceType.TOPIC, "kept")
            admin_client = old.scram("admin", "admin-secret")
            with Producer(zookeeper=old.connect_string, security=admin_client, monitoring=False, acks=-1) as producer:
                for i in range(20):
                    producer.send("kept", b"before the move %d" % i, partition=0)
            before = producer_ids(lambda: admin(old, 0))
            with client(zookeeper.connect_string) as anonymous:
                anonymous.create("/intruder-before", b"at the root anyone may")
            old.cluster.stop()

            moved = zookeeper.connect_string + "/logbus"
            result = logbus(moved, tmp_path, "zookeeper", "protect-root", "--copy-from", "/")
            assert result.returncode == 0, result.stderr
            for broker in old.cluster.brokers.values():
                broker.zookeeper = broker.broker_zookeeper = moved
            old.start_broker(0)

            with client(moved) as anonymous:
                for path in ROOT_NODES:
                    with pytest.raises(NoAuthError):
                        anonymous.delete(path)
                with pytest.raises(NoAuthError):
                    anonymous.create("/intruder", b"mine")
                assert anonymous.get_children(BROKER_TOPICS) == ["kept"] and anonymous.exists(broker_path(0))
                assert not anonymous.exists("/intruder-before")  # only the cluster's nodes were copied
            erin = old.scram("erin", "erin-secret")
            values: list[bytes] = []
            with SimpleConsumer("kept", 0, moved, security=erin, max_wait_ms=100) as consumer:
                wait_until(lambda: values.extend(m.value for m in consumer.fetch()) or len(values) >= 20, 30,
                           "the messages")
            assert values == [b"before the move %d" % i for i in range(20)]
            after = producer_ids(lambda: admin(old, 0))
            assert min(after) > max(before)
        finally:
            old.stop()
