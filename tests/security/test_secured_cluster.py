"""A secured cluster (harness.secured: TLS, SCRAM, mTLS, ACLs, ZooKeeper ACLs) tried as
an attacker, a misconfigured tool and an ordinary user would. Real brokers and
ZooKeeper, certificates made by the test; one cluster for the module."""

from __future__ import annotations

import time
import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from scramp import ScramClient

from broker.client.connection import BrokerConnection
from broker.client.consumer import SimpleConsumer
from broker.client.group import ConsumerGroup
from broker.client.producer import Producer
from broker.client.security import ClientSecurity
from broker.common.acls import Operation, PatternType, Permission, ResourceType
from broker.common.errors import (
    ClusterAuthorizationFailed, ErrorCode, IllegalSaslState, RequestTimedOut, SaslAuthenticationFailed, TopicAuthorizationFailed,
)
from broker.common.message import encode_message_set
from broker.common.protocol import (
    ApiKey, ReplicaFetchPartition, ReplicaFetchRequest, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest,
)
from broker.common.zklayout import broker_path, partition_state_path
from harness.certificates import CertificateAuthority
from harness.process import wait_until
from harness.secured import SecuredCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def secured(tmp_path_factory, zookeeper_for_security):
    cluster = SecuredCluster(tmp_path_factory.mktemp("secured"), zookeeper_for_security)
    try:
        cluster.start(2)
        for user in ("alice", "bob", "carol", "dave"):
            cluster.add_user(user, f"{user}-secret")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def zookeeper_for_security(tmp_path_factory):
    from harness.zookeeper import ZooKeeperServer

    with ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")) as server:
        yield server


def admin(secured: SecuredCluster, broker_id: int = 0) -> BrokerConnection:
    return BrokerConnection(*secured.address(broker_id, "CLIENT"), security=secured.scram("admin", "admin-secret"),
                            timeout=20).connect()


def new_topic(secured: SecuredCluster, replication_factor: int = 1) -> tuple[str, int, int]:
    """A topic of one partition: (name, leader id, leader epoch)."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with admin(secured) as conn:
        conn.create_topic(topic, 1, replication_factor)

        def ready():
            p = conn.metadata([topic]).topics[0].partitions
            return p and p[0].leader >= 0 and len(p[0].isr) == replication_factor and p[0]
        state = wait_until(ready, 30, f"{topic} to have a leader and a full ISR")
    return topic, state.leader, state.leader_epoch


def one(value: bytes) -> bytes:
    return encode_message_set([(None, value, 1)])


# ------------------------------------------------------------------ the forged fetch


def test_a_forged_replica_fetch_cannot_move_the_high_watermark(secured):
    """Issue 20's finding: a client sent REPLICA_FETCH as the paused follower at the
    leader's end, and the next acks=-1 produce was acknowledged for bytes on one broker
    only. Refused now, even for a principal granted ClusterAction: it is not the
    follower's registered principal."""
    topic, leader, epoch = new_topic(secured, replication_factor=2)
    follower = 1 - leader
    secured.allow("User:alice", Operation.CLUSTER_ACTION, ResourceType.CLUSTER)
    secured.allow("User:alice", Operation.WRITE, ResourceType.TOPIC, topic)
    with admin(secured, leader) as conn:
        conn.produce(topic, 0, one(b"before"), acks=-1)
        end = conn.offsets(topic, 0, -1)[0]
    forged = ReplicaFetchRequest(follower, 0, True, (ReplicaFetchPartition(topic, 0, epoch, end + 100, end + 100,
                                                                           1 << 20),))
    secured.cluster.brokers[follower].pause()
    try:
        attempts = [
            BrokerConnection(*secured.address(leader, "CLIENT"), security=secured.scram("alice", "alice-secret")),
            BrokerConnection(*secured.address(leader, "PLAIN")),  # anonymous
        ]
        for attempt in attempts:
            with attempt.connect() as conn:
                with pytest.raises(ClusterAuthorizationFailed):
                    conn.call(ApiKey.REPLICA_FETCH, forged.encode())
        with BrokerConnection(*secured.address(leader, "CLIENT"), security=secured.scram("alice", "alice-secret"),
                              timeout=20).connect() as conn:
            with pytest.raises(RequestTimedOut):
                conn.produce(topic, 0, one(b"only on the leader"), acks=-1, timeout_ms=1500)
    finally:
        secured.cluster.brokers[follower].resume()
    assert "may not ClusterAction" in secured.cluster.brokers[leader].log_tail(200), "the denial is logged"


# ----------------------------------------------------------------------------- TLS


def test_a_plaintext_client_on_a_tls_port_fails_cleanly(secured):
    with pytest.raises(ConnectionError):
        with BrokerConnection(*secured.address(0, "MTLS"), timeout=5) as conn:
            conn.metadata()


def test_a_certificate_from_another_ca_is_refused(secured, tmp_path):
    stranger = CertificateAuthority(tmp_path / "other-ca", "another-ca").issue("mallory")
    security = ClientSecurity("SSL", "MTLS", str(secured.ca.cafile), str(stranger.certfile), str(stranger.keyfile))
    with pytest.raises(ConnectionError, match="TLS|closed|reset"):
        with BrokerConnection(*secured.address(0, "MTLS"), security=security, timeout=5) as conn:
            conn.metadata()


def test_a_client_that_does_not_trust_the_brokers_ca_refuses_them(secured, tmp_path):
    other = CertificateAuthority(tmp_path / "client-ca", "client-only-ca")
    security = ClientSecurity("SASL_SSL", "CLIENT", str(other.cafile), sasl_username="alice",
                              sasl_password="alice-secret")
    with pytest.raises(ConnectionError, match="certificate verify failed"):
        BrokerConnection(*secured.address(0, "CLIENT"), security=security, timeout=5).connect()


def test_produce_fetch_replication_and_groups_over_tls_with_a_certificate_principal(secured):
    """carol is her certificate's subject on the MTLS listener; replication runs on the
    SASL_SSL inter-broker listener (acks=-1 waits for it)."""
    topic, _, _ = new_topic(secured, replication_factor=2)
    carol = secured.certificate("carol")
    principal = "User:CN=carol,O=logbus-tests"
    secured.allow(principal, Operation.WRITE, ResourceType.TOPIC, topic)
    secured.allow(principal, Operation.READ, ResourceType.TOPIC, topic)
    with Producer(zookeeper=secured.connect_string, security=carol, acks=-1, monitoring=False) as producer:
        for i in range(50):
            producer.send(topic, f"m{i}".encode())
        producer.flush(30)
    consumer = SimpleConsumer(topic, 0, secured.connect_string, security=carol, max_wait_ms=100)
    try:
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 50 and time.monotonic() < deadline:
            got += [m.value for m in consumer.fetch()]
    finally:
        consumer.close()
    assert got == [f"m{i}".encode() for i in range(50)]
    group = ConsumerGroup(f"g-{topic}", {topic: 1}, secured.connect_string, security=carol,
                          consumer_timeout_ms=10_000)
    try:
        seen = [m.value for _, m in zip(range(50), group.streams[topic][0])]
    finally:
        group.close()
    assert seen == got


# ---------------------------------------------------------------------------- SCRAM


def scram_attempt(secured: SecuredCluster, user: str, password: str) -> None:
    BrokerConnection(*secured.address(0, "CLIENT"), security=secured.scram(user, password), timeout=10).connect().close()


def test_wrong_password_and_unknown_user_are_refused_alike(secured):
    refusals = []
    for user, password in (("alice", "wrong"), ("nobody", "whatever")):
        with pytest.raises(SaslAuthenticationFailed) as refused:
            scram_attempt(secured, user, password)
        refusals.append(str(refused.value))
    assert refusals[0] == refusals[1], "nothing tells an unknown user from a wrong password"
    assert "alice" not in refusals[0] and "nobody" not in refusals[0]


def raw_handshake(secured: SecuredCluster) -> BrokerConnection:
    conn = BrokerConnection(*secured.address(0, "CLIENT"),
                            security=ClientSecurity("SSL", "CLIENT", str(secured.ca.cafile)), timeout=10).connect()
    conn.call(ApiKey.SASL_HANDSHAKE, SaslHandshakeRequest("SCRAM-SHA-256").encode())
    return conn


def test_a_replayed_handshake_is_refused(secured):
    """An eavesdropper who recorded a whole exchange cannot play it back: the broker's
    nonce differs on every connection."""
    client = ScramClient(["SCRAM-SHA-256"], "bob", "bob-secret")
    with raw_handshake(secured) as conn:
        first = client.get_client_first()
        answer = conn.call(ApiKey.SASL_AUTHENTICATE, SaslAuthenticateRequest(first.encode()).encode())
        client.set_server_first(SaslAuthenticateResponse.decode(answer).auth_bytes.decode())
        final = client.get_client_final()
        conn.call(ApiKey.SASL_AUTHENTICATE, SaslAuthenticateRequest(final.encode()).encode())
        conn.metadata()  # authenticated
    with raw_handshake(secured) as conn:
        conn.call(ApiKey.SASL_AUTHENTICATE, SaslAuthenticateRequest(first.encode()).encode())
        with pytest.raises(SaslAuthenticationFailed):
            conn.call(ApiKey.SASL_AUTHENTICATE, SaslAuthenticateRequest(final.encode()).encode())
        with pytest.raises(ConnectionError):
            conn.metadata()  # and the connection is closed


def test_requests_before_authenticating_get_only_the_handshake(secured):
    with BrokerConnection(*secured.address(0, "CLIENT"),
                          security=ClientSecurity("SSL", "CLIENT", str(secured.ca.cafile)), timeout=10) as conn:
        with pytest.raises(IllegalSaslState, match="SASL_HANDSHAKE"):
            conn.metadata()
        with pytest.raises(ConnectionError):
            conn.metadata()


def test_a_password_change_holds_for_new_connections(secured):
    secured.add_user("dave", "dave-old")
    old = BrokerConnection(*secured.address(0, "CLIENT"), security=secured.scram("dave", "dave-old")).connect()
    secured.add_user("dave", "dave-new")
    with pytest.raises(SaslAuthenticationFailed):
        scram_attempt(secured, "dave", "dave-old")
    scram_attempt(secured, "dave", "dave-new")
    with old:
        old.metadata()  # an authenticated connection keeps its session


# ----------------------------------------------------------------------------- ACLs


def test_read_only_cannot_produce_and_describe_decides_what_metadata_shows(secured):
    topic, leader, _ = new_topic(secured)
    hidden, _, _ = new_topic(secured)
    secured.allow("User:bob", Operation.READ, ResourceType.TOPIC, topic)
    bob = secured.scram("bob", "bob-secret")
    with BrokerConnection(*secured.address(leader, "CLIENT"), security=bob).connect() as conn:
        with pytest.raises(TopicAuthorizationFailed):
            conn.produce(topic, 0, one(b"no"), acks=1)
        conn.fetch(topic, 0, 0)  # Read is allowed
        listed = [t.topic for t in conn.metadata().topics]
        assert topic in listed and hidden not in listed
        assert conn.metadata([hidden]).topics[0].error_code == TopicAuthorizationFailed.code


def test_record_count_needs_describe_on_the_topic(secured):
    topic, leader, _ = new_topic(secured)
    with admin(secured, leader) as conn:
        conn.produce(topic, 0, one(b"counted"), acks=-1)
    carol = secured.scram("carol", "carol-secret")
    with BrokerConnection(*secured.address(leader, "CLIENT"), security=carol).connect() as conn:
        with pytest.raises(TopicAuthorizationFailed):
            conn.record_count(topic, 0, 0)
        secured.allow("User:carol", Operation.DESCRIBE, ResourceType.TOPIC, topic)

        def counted():
            try:
                return conn.record_count(topic, 0, 0).records
            except TopicAuthorizationFailed:
                return None  # the broker has not seen the new ACL yet
        assert wait_until(counted, 10, "the broker to apply carol's Describe ACL") == 1


def test_delete_topic_needs_delete_on_the_topic_and_all_implies_it(secured):
    """DELETE_TOPIC on a secured cluster (ZooKeeper ACLs on): refused without Delete,
    whether the topic exists or not; Read does not imply it; All does. The deletion is
    carried out by the controller, under the cluster's ZooKeeper identity."""
    topic, _, _ = new_topic(secured, replication_factor=2)
    secured.add_user("delia", "delia-secret")  # a user no other test changes
    delia = secured.scram("delia", "delia-secret")
    secured.allow("User:delia", Operation.READ, ResourceType.TOPIC, topic)
    with BrokerConnection(*secured.address(0, "CLIENT"), security=delia, timeout=20).connect() as conn:
        for name in (topic, f"t-{uuid.uuid4().hex[:8]}"):
            with pytest.raises(TopicAuthorizationFailed, match="may not Delete"):
                conn.delete_topic(name)
        secured.allow("User:delia", Operation.ALL, ResourceType.TOPIC, topic)
        conn.delete_topic(topic, 20_000)
    with admin(secured) as conn:
        assert conn.metadata([topic]).topics[0].error_code == ErrorCode.UNKNOWN_TOPIC


def test_a_prefixed_acl_covers_new_topics_and_deny_beats_allow(secured):
    prefix = f"sales-{uuid.uuid4().hex[:6]}-"
    secured.allow("User:alice", Operation.WRITE, ResourceType.TOPIC, prefix, PatternType.PREFIXED)
    secured.allow("User:alice", Operation.CREATE, ResourceType.TOPIC, prefix, PatternType.PREFIXED)
    secured.allow("User:alice", Operation.WRITE, ResourceType.TOPIC, prefix + "secret", permission=Permission.DENY)
    alice = secured.scram("alice", "alice-secret")
    with Producer(zookeeper=secured.connect_string, security=alice, acks=1, monitoring=False) as producer:
        producer.send(prefix + "orders", b"created by a first produce")
    with BrokerConnection(*secured.address(0, "CLIENT"), security=alice).connect() as conn:
        conn.create_topic(prefix + "secret", 1)
    topic = prefix + "secret"
    with admin(secured) as conn:
        leader = wait_until(lambda: [p.leader for p in conn.metadata([topic]).topics[0].partitions if p.leader >= 0],
                            30, f"{topic} to have a leader")[0]
    with BrokerConnection(*secured.address(leader, "CLIENT"), security=alice).connect() as conn:
        with pytest.raises(TopicAuthorizationFailed):
            conn.produce(topic, 0, one(b"denied"), acks=1)


def test_acl_changes_reach_every_broker(secured):
    topic, _, _ = new_topic(secured)
    bob = secured.scram("bob", "bob-secret")

    def describes(broker_id: int) -> bool:
        with BrokerConnection(*secured.address(broker_id, "CLIENT"), security=bob).connect() as conn:
            return conn.metadata([topic]).topics[0].error_code == 0

    assert not describes(0) and not describes(1)
    secured.allow("User:bob", Operation.DESCRIBE, ResourceType.TOPIC, topic)
    wait_until(lambda: describes(0) and describes(1), 10, "both brokers to apply the new ACL")


# ------------------------------------------------------------------------ ZooKeeper


def test_an_ordinary_zookeeper_client_cannot_change_what_brokers_own(secured):
    topic, _, _ = new_topic(secured)
    zk = KazooClient(secured.connect_string)
    zk.start(30)
    try:
        zk.get(broker_path(0))  # reading is open
        with pytest.raises(NoAuthError):
            zk.delete(broker_path(0))
        with pytest.raises(NoAuthError):
            zk.set(partition_state_path(topic, 0), b'{"leader": 1}')
        with pytest.raises(NoAuthError):
            zk.get("/logbus_users/alice")  # salted keys are for brokers only
    finally:
        zk.stop()
        zk.close()
