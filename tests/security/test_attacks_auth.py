"""Issue 34's attacks on authentication, each against a secured cluster (harness.secured):
telling users that exist from those that do not by their SCRAM salts, a certificate
whose common name spells another subject, unauthenticated connections that announce
huge frames, and secrets read from a broker's command line. Real brokers and
ZooKeeper; one cluster for the module."""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import uuid
from pathlib import Path

import pytest
from scramp import ScramClient

from broker.client.connection import BrokerConnection
from broker.client.security import ClientSecurity
from broker.common.acls import Operation, ResourceType
from broker.common.errors import TopicAuthorizationFailed
from broker.common.message import encode_message_set
from broker.common.protocol import ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest
from harness.cluster import broker_command
from harness.process import free_port, wait_until
from harness.secured import ZOOKEEPER_AUTH, SecuredCluster, secured_cluster

pytestmark = pytest.mark.slow
MiB = 1 << 20


@pytest.fixture(scope="module")
def secured():
    """Two brokers. A request's read timeout far beyond any test's wait: a connection
    that holds the broker's budget is closed for what it sent, never by the timer."""
    with secured_cluster(2, settings={"request.read.timeout.ms": 600_000}) as cluster:
        cluster.add_user("alice", "alice-secret")
        yield cluster


def new_topic(secured: SecuredCluster) -> tuple[str, int]:
    """A topic of one partition and one replica: (name, leader id)."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with BrokerConnection(*secured.address(0, "CLIENT"), security=secured.scram("admin", "admin-secret"),
                          timeout=20).connect() as conn:
        conn.create_topic(topic, 1, 1)
        leader = wait_until(lambda: [p.leader for p in conn.metadata([topic]).topics[0].partitions if p.leader >= 0],
                            30, f"{topic} to have a leader")[0]
    return topic, leader


# ---------------------------------------------------------------------------- SCRAM


def server_first(secured: SecuredCluster, broker_id: int, user: str, mechanism: str = "SCRAM-SHA-256") -> dict:
    """The broker's answer to a client-first message for `user`: its nonce `r`, salt `s`
    and iteration count `i`, as any client that can reach the listener sees them."""
    tls_only = ClientSecurity("SSL", "CLIENT", str(secured.ca.cafile))
    with BrokerConnection(*secured.address(broker_id, "CLIENT"), security=tls_only, timeout=20).connect() as conn:
        conn.call(ApiKey.SASL_HANDSHAKE, SaslHandshakeRequest(mechanism).encode())
        first = ScramClient([mechanism], user, "any password").get_client_first()
        answer = conn.call(ApiKey.SASL_AUTHENTICATE, SaslAuthenticateRequest(first.encode()).encode())
    text = SaslAuthenticateResponse.decode(answer).auth_bytes.decode()
    return dict(part.split("=", 1) for part in text.split(","))


def test_scram_answers_an_unknown_user_as_every_broker_answers_a_known_one(secured):
    """Issue 34's finding: each broker made an unknown user's salt from its own password,
    so two brokers gave two salts for an unknown user and one for a real user — and a
    count of 8192 where real users showed theirs."""
    unknown = f"nobody-{uuid.uuid4().hex[:8]}"
    known = [server_first(secured, b, "alice") for b in (0, 1)]
    invented = [server_first(secured, b, unknown) for b in (0, 1)]
    assert known[0]["s"] == known[1]["s"]
    assert invented[0]["s"] == invented[1]["s"], "one salt for an unknown user on every broker, as for a real one"
    assert invented[0]["s"] == server_first(secured, 0, unknown)["s"], "and the same salt every time"
    assert invented[0]["i"] == known[0]["i"], "the iteration count a real user shows"
    assert len(invented[0]["s"]) == len(known[0]["s"]), "a salt as long as a real one"


def test_an_unknown_user_has_a_salt_per_mechanism_as_a_known_user_has(secured):
    unknown = f"nobody-{uuid.uuid4().hex[:8]}"
    for user in ("alice", unknown):
        salts = {server_first(secured, 0, user, mechanism)["s"] for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")}
        assert len(salts) == 2, user


# ------------------------------------------------------------------- certificate names


def test_a_common_name_that_spells_another_subject_does_not_get_its_grant(secured):
    """Issue 34's finding: CN `alice,OU=payments` (no OU) was read as the subject
    CN=alice,OU=payments,O=... and read the topic granted to that subject alone."""
    topic, leader = new_topic(secured)
    secured.allow("User:CN=alice,OU=payments,O=logbus-tests", Operation.READ, ResourceType.TOPIC, topic)
    genuine = secured.ca.issue("alice", unit="payments")
    crafted = secured.ca.issue("alice,OU=payments")
    cafile = str(secured.ca.cafile)
    for issued, allowed in ((genuine, True), (crafted, False)):
        security = ClientSecurity("SSL", "MTLS", cafile, str(issued.certfile), str(issued.keyfile))
        with BrokerConnection(*secured.address(leader, "MTLS"), security=security, timeout=20).connect() as conn:
            if allowed:
                conn.fetch(topic, 0, 0)
            else:
                with pytest.raises(TopicAuthorizationFailed):
                    conn.fetch(topic, 0, 0)


# ------------------------------------------------------------- unauthenticated frames


def announce_frame(address: tuple[str, int], cafile: Path, size: int) -> ssl.SSLSocket:
    """A TLS connection that announces a frame of `size` bytes, sends its header's first
    bytes and nothing more — and never authenticates."""
    raw = socket.create_connection(address, timeout=10)
    sock = ssl.create_default_context(cafile=str(cafile)).wrap_socket(raw, server_hostname="127.0.0.1")
    sock.sendall(struct.pack(">ihhi", size, ApiKey.PRODUCE, 0, 1))
    return sock


def closed_by_broker(sock: ssl.SSLSocket) -> bool:
    """Whether the broker closed the connection (whatever it answered first)."""
    sock.settimeout(0.05)
    try:
        while sock.recv(65536):
            pass
        return True
    except (socket.timeout, ssl.SSLWantReadError):
        return False
    except (ConnectionError, ssl.SSLError):
        return True


def test_unauthenticated_frames_reserve_none_of_the_brokers_budget(secured):
    """Issue 34's finding: two connections that announced 90 MiB before authenticating
    and sent nothing more held the broker-wide budget, and an authenticated 400 KiB
    produce waited behind them. Now the broker refuses such a frame before
    authentication: the produce goes through while the attackers keep their
    connections open."""
    topic, leader = new_topic(secured)
    broker = secured.cluster.brokers[leader]
    mark = broker.log_size()
    attackers = [announce_frame(secured.address(leader, "CLIENT"), secured.ca.cafile, 90 * MiB) for _ in range(2)]
    try:
        with BrokerConnection(*secured.address(leader, "CLIENT"), security=secured.scram("admin", "admin-secret"),
                              timeout=60).connect() as conn:
            produced = conn.produce(topic, 0, encode_message_set([(None, b"x" * 400 * 1024, 1)]), acks=1)
        assert produced is not None
        for sock in attackers:
            wait_until(lambda: closed_by_broker(sock), 30, "the broker to close the unauthenticated connection")
        assert broker.logged_since(mark, "before authentication"), broker.log_tail()
    finally:
        for sock in attackers:
            sock.close()


# ------------------------------------------------------------------------- secrets


def test_no_secret_is_in_any_brokers_command_line(secured):
    """Issue 34's finding: `--set zookeeper.auth=...` and the inter-broker password were in
    /proc/<pid>/cmdline, which every local user may read."""
    secrets = [ZOOKEEPER_AUTH.partition(":")[2]] + [f"broker-{b}-secret" for b in secured.cluster.brokers]
    for broker in secured.cluster.brokers.values():
        assert broker.alive
        command_line = Path(f"/proc/{broker.process.pid}/cmdline").read_bytes().decode()
        assert not [s for s in secrets if s in command_line], command_line.replace("\0", " ")


def test_a_properties_file_with_secrets_that_others_may_read_is_refused(tmp_path):
    config = tmp_path / "broker.properties"
    config.write_text(f"zookeeper.auth={ZOOKEEPER_AUTH}\nzookeeper.connection.timeout.ms=1000\n")
    config.chmod(0o644)
    started = subprocess.run([*broker_command(), "--config", str(config), "--broker-id", "0",
                              "--zookeeper", f"127.0.0.1:{free_port()}", "--log-dir", str(tmp_path / "logs")],
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 2, started.stderr
    assert str(config) in started.stderr and "chmod 600" in started.stderr, started.stderr
    assert ZOOKEEPER_AUTH not in started.stderr
