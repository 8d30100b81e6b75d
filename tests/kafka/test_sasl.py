"""SASL on the Kafka listener (docs/kafka.md, "SASL") against a secured cluster
(harness.secured) whose broker also has Kafka listeners KAFKA_SASL_PLAINTEXT and
KAFKA_SASL_SSL: librdkafka authenticating with SCRAM-SHA-256 and -512 on the cluster's
users, and with PLAIN only over TLS; a wrong password and an unknown user refused
alike, the connection closed after the refusal; the ACLs of CreateTopics and
DescribeConfigs. One cluster for the module; real ZooKeeper and broker."""

from __future__ import annotations

import socket
import struct
import tempfile
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType as KafkaResource
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest

from broker.common.acls import Operation, PatternType, ResourceType
from harness.frames import read_frame
from harness.process import free_port, wait_until
from harness.secured import LISTENERS, PROTOCOLS, SecuredCluster
from harness.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.slow
TIMEOUT = 30
KAFKA_LISTENERS = ("KAFKA_SASL_PLAINTEXT", "KAFKA_SASL_SSL")


@pytest.fixture(scope="module")
def secured():
    """One broker of a secured cluster with two Kafka SASL listeners, PLAIN enabled;
    users admin (super-user) and alice (no ACL)."""
    with tempfile.TemporaryDirectory(prefix="logbus-kafka-sasl-") as workdir, \
            ZooKeeperServer(Path(workdir) / "zookeeper") as zookeeper:
        cluster = SecuredCluster(Path(workdir), zookeeper, settings={
            "listener.security.protocol.map": f"{PROTOCOLS},KAFKA_SASL_PLAINTEXT:SASL_PLAINTEXT,KAFKA_SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
        })
        try:
            cluster.ports[0] = {name: free_port() for name in LISTENERS + KAFKA_LISTENERS}
            cluster.add_user("broker-0", "broker-0-secret")
            cluster.start_broker(0)
            cluster.add_user("alice", "alice-secret")
            yield cluster
        finally:
            cluster.stop()


def client_config(secured: SecuredCluster, user: str, password: str, mechanism: str = "SCRAM-SHA-256",
                  listener: str = "KAFKA_SASL_PLAINTEXT", **more) -> dict:
    host, port = secured.address(0, listener)
    protocol = "SASL_SSL" if listener == "KAFKA_SASL_SSL" else "SASL_PLAINTEXT"
    return {"bootstrap.servers": f"{host}:{port}", "security.protocol": protocol, "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password, "ssl.ca.location": str(secured.ca.cafile), **more}


def create(admin: AdminClient, name: str) -> KafkaError | None:
    try:
        admin.create_topics([NewTopic(name, 1, 1)], request_timeout=TIMEOUT)[name].result(TIMEOUT)
    except KafkaException as exc:
        return exc.args[0]
    return None


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_users_create_topics_and_read_metadata(secured, mechanism):
    admin = AdminClient(client_config(secured, "admin", "admin-secret", mechanism))
    name = f"s-{uuid.uuid4().hex[:8]}"
    assert create(admin, name) is None
    metadata = admin.list_topics(timeout=TIMEOUT)
    assert len(metadata.topics[name].partitions) == 1
    assert [b.port for b in metadata.brokers.values()] == [secured.address(0, "KAFKA_SASL_PLAINTEXT")[1]]


def refusal(config: dict) -> KafkaError:
    """The error librdkafka reports when its connection's authentication fails."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append})
    try:
        return wait_until(lambda: producer.poll(0.2) is not None and [e for e in errors if e.code() in (
            KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED)], TIMEOUT,
            "librdkafka to report the refused authentication")[0]
    finally:
        producer.flush(0)


def test_a_wrong_password_and_an_unknown_user_are_refused_alike(secured):
    wrong = refusal(client_config(secured, "alice", "not-her-secret"))
    unknown = refusal(client_config(secured, f"nobody-{uuid.uuid4().hex[:6]}", "alice-secret"))
    assert "authentication failed: invalid credentials" in wrong.str()
    assert wrong.code() == unknown.code() and wrong.str().split("(after")[0] == unknown.str().split("(after")[0]


def test_plain_is_offered_over_tls_only_and_checked_against_the_scram_credentials(secured):
    admin = AdminClient(client_config(secured, "admin", "admin-secret", "PLAIN", "KAFKA_SASL_SSL"))
    assert admin.list_topics(timeout=TIMEOUT).brokers  # authenticated: metadata answered
    wrong = refusal(client_config(secured, "alice", "wrong", "PLAIN", "KAFKA_SASL_SSL"))
    unknown = refusal(client_config(secured, f"nobody-{uuid.uuid4().hex[:6]}", "wrong", "PLAIN", "KAFKA_SASL_SSL"))
    assert "invalid credentials" in wrong.str()
    assert wrong.str().split("(after")[0] == unknown.str().split("(after")[0]
    in_clear = refusal(client_config(secured, "alice", "alice-secret", "PLAIN"))
    assert "PLAIN" in in_clear.str() and "SCRAM-SHA-256" in in_clear.str()  # the broker's list, without PLAIN


def test_kafka_python_and_aiokafka_authenticate_with_scram(secured):
    """Their SASL: SaslHandshake v1 then SaslAuthenticate, as librdkafka's."""
    import asyncio

    from aiokafka import AIOKafkaProducer
    from kafka.admin import KafkaAdminClient

    name = f"py-{uuid.uuid4().hex[:8]}"
    assert create(AdminClient(client_config(secured, "admin", "admin-secret")), name) is None
    host, port = secured.address(0, "KAFKA_SASL_PLAINTEXT")
    sasl = dict(bootstrap_servers=f"{host}:{port}", security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="admin", sasl_plain_password="admin-secret")
    admin = KafkaAdminClient(request_timeout_ms=TIMEOUT * 1000, **sasl)
    try:
        assert name in admin.list_topics()
    finally:
        admin.close()

    async def aiokafka_topics() -> set[str]:
        producer = AIOKafkaProducer(request_timeout_ms=TIMEOUT * 1000, **sasl)
        await producer.start()
        try:
            await producer.client.force_metadata_update()
            return producer.client.cluster.topics()
        finally:
            await producer.stop()

    assert name in asyncio.run(aiokafka_topics())


def frame(request, correlation_id: int) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="test")
    body = bytes(request.encode(header=True))
    return struct.pack(">i", len(body)) + body


def test_a_failed_authentication_is_answered_then_the_connection_closed(secured):
    with socket.create_connection(secured.address(0, "KAFKA_SASL_PLAINTEXT"), timeout=TIMEOUT) as sock:
        sock.sendall(frame(SaslHandshakeRequest(mechanism="SCRAM-SHA-256", version=1), 1))
        read_frame(sock)
        sock.sendall(frame(SaslAuthenticateRequest(auth_bytes=b"n,,n=alice,r=" + b"a" * 24, version=2), 2))
        first = SaslAuthenticateResponse.decode(read_frame(sock), version=2, header=True)
        assert first.error_code == 0
        nonce = first.auth_bytes.decode().split(",")[0]
        sock.sendall(frame(SaslAuthenticateRequest(auth_bytes=f"c=biws,{nonce},p=AAAA".encode(), version=2), 3))
        final = SaslAuthenticateResponse.decode(read_frame(sock), version=2, header=True)
        assert (final.header.correlation_id, final.error_code) == (3, KafkaError.SASL_AUTHENTICATION_FAILED)
        assert final.error_message == "authentication failed: invalid credentials"
        assert sock.recv(1) == b""  # closed by the broker after its answer


def test_a_request_before_authentication_is_refused_then_the_connection_closed(secured):
    from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

    with socket.create_connection(secured.address(0, "KAFKA_SASL_PLAINTEXT"), timeout=TIMEOUT) as sock:
        sock.sendall(frame(MetadataRequest(topics=None, version=8), 1))
        answer = MetadataResponse.decode(read_frame(sock), version=8, header=True)
        assert answer.header.correlation_id == 1 and not answer.topics and not answer.brokers
        assert sock.recv(1) == b""


def test_create_topics_and_describe_configs_need_their_acls(secured):
    admin = AdminClient(client_config(secured, "alice", "alice-secret"))
    name = f"alice-{uuid.uuid4().hex[:8]}"
    assert create(admin, name).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert name not in AdminClient(client_config(secured, "admin", "admin-secret")).list_topics(timeout=TIMEOUT).topics
    secured.allow("User:alice", Operation.CREATE, ResourceType.TOPIC, "alice-", PatternType.PREFIXED)
    assert create(admin, name) is None

    def describe(resource: ConfigResource) -> KafkaError | None:
        try:
            admin.describe_configs([resource], request_timeout=TIMEOUT)[resource].result(TIMEOUT)
        except KafkaException as exc:
            return exc.args[0]
        return None

    topic, broker = ConfigResource(KafkaResource.TOPIC, name), ConfigResource(KafkaResource.BROKER, "0")
    assert describe(topic).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert describe(broker).code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    secured.allow("User:alice", Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, name)
    assert describe(topic) is None


def test_delete_topics_needs_delete_on_the_topic(secured):
    """Without Delete (and without Describe) a topic is refused TOPIC_AUTHORIZATION_FAILED,
    existing or not, so it stays unseen; with Delete on it the deletion goes through."""
    admin = AdminClient(client_config(secured, "admin", "admin-secret"))
    alice = AdminClient(client_config(secured, "alice", "alice-secret"))
    name, missing = f"del-{uuid.uuid4().hex[:8]}", f"del-{uuid.uuid4().hex[:8]}"
    assert create(admin, name) is None

    def delete(client: AdminClient, topic: str) -> KafkaError | None:
        try:
            client.delete_topics([topic], request_timeout=TIMEOUT, operation_timeout=TIMEOUT)[topic].result(TIMEOUT)
        except KafkaException as exc:
            return exc.args[0]
        return None

    assert delete(alice, name).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert delete(alice, missing).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert name in admin.list_topics(timeout=TIMEOUT).topics
    secured.allow("User:alice", Operation.DELETE, ResourceType.TOPIC, "del-", PatternType.PREFIXED)
    assert delete(alice, missing).code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert delete(alice, name) is None
    assert name not in admin.list_topics(timeout=TIMEOUT).topics
