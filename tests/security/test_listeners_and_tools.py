"""Listeners as a broker behind NAT needs them, certificates renewed without a restart,
and `logbus users` / `logbus acls` as an operator runs them. Real brokers and
ZooKeeper."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.client.connection import BrokerConnection
from broker.client.producer import Producer
from broker.common.acls import read_acls
from broker.common.credentials import list_users
from broker.common.errors import SaslAuthenticationFailed
from harness.process import free_port, wait_until
from harness.proxy import TcpProxy
from harness.secured import ZOOKEEPER_AUTH, SecuredCluster
from harness.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.slow
LOGBUS = Path(sys.executable).parent / "logbus"


def test_a_broker_behind_nat_is_reached_at_its_advertised_address(cluster, zk_connect):
    """The broker binds one port and advertises another (a proxy standing in for NAT):
    clients that find it through ZooKeeper must use the advertised one."""
    bound = free_port()
    with TcpProxy(("127.0.0.1", bound)) as nat:
        cluster.start_broker(0, {"listeners": f"PLAINTEXT://127.0.0.1:{bound}",
                                 "advertised.listeners": f"PLAINTEXT://127.0.0.1:{nat.port}"}, port=nat.port)
        with Producer(zookeeper=zk_connect, acks=1, monitoring=False, request_timeout_ms=3000,
                      delivery_timeout_ms=6000, retries=1) as producer:
            producer.send("natted", b"through the advertised address")
            nat.cut()
            with pytest.raises(Exception):
                producer.send("natted", b"no way in once the NAT is cut")


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    work = tmp_path_factory.mktemp("secured-tools")
    with ZooKeeperServer(work / "zookeeper") as zookeeper:
        cluster = SecuredCluster(work, zookeeper, settings={"ssl.reload.interval.ms": 200})
        try:
            cluster.start(1)
            yield cluster
        finally:
            cluster.stop()


def peer_subject(address: tuple[str, int], cafile: Path) -> str:
    context = ssl.create_default_context(cafile=str(cafile))
    with socket.create_connection(address, timeout=10) as raw, context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        return ",".join(f"{k}={v}" for rdn in s.getpeercert()["subject"] for k, v in rdn)


def test_renewed_certificates_are_used_without_a_restart(secured):
    address = secured.address(0, "MTLS")
    assert "organizationName=logbus-tests" in peer_subject(address, secured.ca.cafile)
    client = secured.certificate("renewal-watcher")
    established = BrokerConnection(*address, security=client).connect()
    time.sleep(0.05)
    secured.ca.issue("broker-0", organization="renewed")  # the same files, a new certificate
    wait_until(lambda: "organizationName=renewed" in peer_subject(address, secured.ca.cafile), 20,
               "new connections to get the renewed certificate")
    with established:
        established.metadata()  # an established connection keeps going
    assert secured.cluster.brokers[0].alive


def run(secured: SecuredCluster, tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    config = tmp_path / "admin.properties"
    config.write_text(f"security.protocol=SASL_SSL\nlistener.name=CLIENT\nssl.cafile={secured.ca.cafile}\n"
                      f"sasl.username=admin\nsasl.password=admin-secret\nzookeeper.auth={ZOOKEEPER_AUTH}\n"
                      "zookeeper.set.acl=true\n")
    config.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "LOGBUS_ZOOKEEPER"}
    return subprocess.run([str(LOGBUS), "--zookeeper", secured.connect_string, "--command-config",
                           str(config), *args], input=stdin, capture_output=True, text=True, env=env, timeout=120)


def test_users_are_added_from_stdin_and_only_salted_keys_are_stored(secured, tmp_path):
    added = run(secured, tmp_path, "users", "add", "erin", stdin="erin-password\n")
    assert added.returncode == 0, added.stderr
    assert "erin\tSCRAM-SHA-256,SCRAM-SHA-512" in run(secured, tmp_path, "users", "list").stdout
    stored = secured.admin_zk.get("/logbus_users/erin")[0]
    assert b"erin-password" not in stored
    BrokerConnection(*secured.address(0, "CLIENT"), security=secured.scram("erin", "erin-password")).connect().close()
    assert run(secured, tmp_path, "users", "delete", "erin").returncode == 0
    with pytest.raises(SaslAuthenticationFailed):
        BrokerConnection(*secured.address(0, "CLIENT"), security=secured.scram("erin", "erin-password")).connect()
    assert "erin" not in list_users(secured.admin_zk)


def test_acls_are_added_listed_and_removed(secured, tmp_path):
    add = run(secured, tmp_path, "acls", "--add", "--allow-principal", "User:frank", "--operation", "Read",
              "--operation", "describe", "--operation", "delete", "--topic", "clicks")
    assert add.returncode == 0, add.stderr
    listed = run(secured, tmp_path, "acls", "--list", "--topic", "clicks").stdout
    assert "topic:clicks\tallow\tUser:frank\tRead" in listed and "Describe" in listed
    assert "topic:clicks\tallow\tUser:frank\tDelete" in listed
    assert run(secured, tmp_path, "acls", "--remove", "--allow-principal", "User:frank", "--operation", "Read",
               "--operation", "Describe", "--operation", "Delete", "--topic", "clicks").returncode == 0
    assert not [a for a in read_acls(secured.admin_zk) if a.resource.name == "clicks"]


@pytest.mark.parametrize("args, says", [
    (("acls", "--add", "--allow-principal", "frank", "--operation", "Read", "--topic", "t"), "write User:NAME"),
    (("acls", "--add", "--allow-principal", "User:frank", "--operation", "Read"), "name the resource"),
    (("acls", "--add", "--allow-principal", "User:frank", "--operation", "Fly", "--topic", "t"), "unknown Operation"),
    (("acls", "--add", "--topic", "t"), "at least one --allow-principal"),
    (("acls", "--add", "--allow-principal", "User:frank", "--operation", "Read", "--topic", "",
      "--resource-pattern-type", "prefixed"), "an empty resource name"),
    (("acls", "--add", "--allow-principal", "User:frank", "--operation", "Read", "--group", ""),
     "an empty resource name"),
    (("users", "add", "bad,name"), "invalid user name"),
    (("users", "add", "nobody-with-no-password"), "the password is empty"),
])
def test_bad_input_is_one_line_and_changes_nothing(secured, tmp_path, args, says):
    before = (read_acls(secured.admin_zk), list_users(secured.admin_zk))
    result = run(secured, tmp_path, *args)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and says in result.stderr, result.stderr
    assert (read_acls(secured.admin_zk), list_users(secured.admin_zk)) == before


def test_without_the_zookeeper_identity_the_command_cannot_write_acls(secured, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LOGBUS_ZOOKEEPER"}
    result = subprocess.run([str(LOGBUS), "--zookeeper", secured.connect_string, "acls", "--add",
                             "--allow-principal", "User:mallory", "--operation", "All", "--cluster"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode != 0 and "NoAuth" in result.stderr, result.stderr
    assert not [a for a in read_acls(secured.admin_zk) if a.entry.principal == "User:mallory"]
