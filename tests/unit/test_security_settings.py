"""Security settings and ACL decisions, without a cluster: what a broker refuses to
start with, what a client refuses to be configured with, and the ACL rule."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import broker.client.security as security_module
from broker.client.security import ClientSecurity
from broker.common.acls import Acl, AclEntry, Operation, PatternType, Permission, Resource, ResourceType, decide
from broker.common.listeners import Endpoint, SecurityProtocol, parse_endpoints
from broker.server.auth.listeners import inter_broker_listener, listeners
from broker.server.config import BrokerConfig, ConfigError
from harness.certificates import CertificateAuthority

BASE = {"broker.id": "0", "zookeeper.connect": "127.0.0.1:2181"}


def config(**settings: str) -> BrokerConfig:
    return BrokerConfig.from_settings({**BASE, **{k.replace("_", "."): v for k, v in settings.items()}})


def test_without_listeners_one_plaintext_listener_at_host_and_port():
    served = listeners(BrokerConfig.from_settings({**BASE, "host": "10.0.0.5", "port": "9999"}))
    assert [(l.name, l.protocol, l.bind, l.advertised) for l in served] == [
        ("PLAINTEXT", SecurityProtocol.PLAINTEXT, Endpoint("PLAINTEXT", "10.0.0.5", 9999),
         Endpoint("PLAINTEXT", "10.0.0.5", 9999))]


def test_advertised_listeners_and_the_inter_broker_one():
    c = BrokerConfig.from_settings({**BASE, "listeners": "INTERNAL://:9093,CLIENT://0.0.0.0:9094",
                                    "advertised.listeners": "CLIENT://broker-0.example.com:19094",
                                    "listener.security.protocol.map": "INTERNAL:PLAINTEXT,CLIENT:PLAINTEXT",
                                    "inter.broker.listener.name": "internal"})
    served = {l.name: l for l in listeners(c)}
    assert served["CLIENT"].advertised == Endpoint("CLIENT", "broker-0.example.com", 19094)
    assert served["INTERNAL"].advertised == Endpoint("INTERNAL", "127.0.0.1", 9093)  # host fills an empty bind
    assert inter_broker_listener(c).name == "INTERNAL"


@pytest.mark.parametrize("settings, says", [
    ({"listeners": "PLAINTEXT//:9092"}, "is not NAME://host:port"),
    ({"listeners": "A://:1,A://:2"}, "unique"),
    ({"listeners": "SECRET://:9092"}, "SECRET has no security protocol"),
    ({"listeners": "PLAINTEXT://:9092", "advertised.listeners": "OTHER://h:1"}, "OTHER, which is not in listeners"),
    ({"listeners": "PLAINTEXT://:9092", "inter.broker.listener.name": "X"}, "inter.broker.listener.name=X"),
    ({"listeners": "SSL://:9093"}, "a TLS listener needs ssl.certfile"),
    ({"listeners": "SSL://:9093", "ssl.certfile": "/nonexistent.pem", "ssl.keyfile": "/nonexistent.key"},
     "no such file"),
    ({"listeners": "SASL_PLAINTEXT://:9093"}, "set inter.broker.sasl.username and inter.broker.sasl.password"),
    ({"ssl.client.auth": "required"}, "needs ssl.cafile"),
    ({"ssl.client.auth": "maybe"}, "must be none, requested or required"),
    ({"zookeeper.set.acl": "true"}, "zookeeper.set.acl needs zookeeper.auth"),
    ({"super.users": "alice"}, "must be User:<name> entries"),
    ({"sasl.enabled.mechanisms": "PLAIN"}, "must name SCRAM-SHA-256"),
    ({"sasl.enabled.mechanisms": "SCRAM-SHA-256,GSSAPI"}, "may add PLAIN"),
    ({"listener.security.protocol.map": "PLAINTEXT:TLS"}, "unknown security protocol"),
])
def test_inconsistent_security_settings_are_refused_at_start(settings, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace("+", r"\+")):
        BrokerConfig.from_settings({**BASE, **settings})


def test_a_broker_configuration_never_prints_its_passwords():
    c = BrokerConfig.from_settings({**BASE, "zookeeper.auth": "logbus:zk-secret",
                                    "inter.broker.sasl.password": "broker-secret"})
    assert "zk-secret" not in repr(c) and "broker-secret" not in repr(c)


def test_client_security_refuses_what_cannot_work(tmp_path):
    with pytest.raises(ValueError, match="needs sasl.username and sasl.password"):
        ClientSecurity("SASL_SSL")
    with pytest.raises(ValueError, match="unknown security setting.*sasl.pasword"):
        ClientSecurity.from_properties({"security.protocol": "SASL_SSL", "sasl.pasword": "x"})
    with pytest.raises(ValueError, match="ssl.cafile='/nope': no such file"):
        ClientSecurity("SSL", ssl_cafile="/nope")
    with pytest.raises(ValueError, match="unknown security protocol"):
        ClientSecurity("TLS")
    with pytest.raises(ValueError, match="go together"):
        cert = tmp_path / "c.pem"
        cert.write_text("x")
        ClientSecurity("SSL", ssl_certfile=str(cert))
    secured = ClientSecurity("SASL_SSL", sasl_username="u", sasl_password="hunter2")
    assert "hunter2" not in repr(secured)


INLINE_PEM_THEN_EXIT = """
import os, sys
from pathlib import Path
from broker.client.security import ClientSecurity
ca, cert, key = (Path(p).read_text() for p in sys.argv[1:4])
security = ClientSecurity.from_properties({"security.protocol": "SSL", "ssl.ca.pem": ca, "ssl.cert.pem": cert,
                                           "ssl.private.key": key})
security.ssl_context()  # the key loads from where it was put
child = os.fork()  # as Airflow's task runner: the forked child connects with the same settings
if child == 0:
    security.ssl_context()
    os._exit(0)
_, status = os.waitpid(child, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
os._exit(0)  # as Airflow's task processes end: no atexit
"""


def test_inline_pem_is_readable_in_the_process_and_its_forks_and_left_nowhere_after_os_exit(tmp_path):
    """Airflow's task processes take the connection's PEM text inline and end with
    os._exit; the private key must not stay behind in the temporary directory."""
    ca = CertificateAuthority(tmp_path / "ca")
    issued = ca.issue("task")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run([sys.executable, "-c", INLINE_PEM_THEN_EXIT, str(ca.cafile), str(issued.certfile),
                           str(issued.keyfile)], env={**os.environ, "TMPDIR": str(scratch)},
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "child 0"), done.stderr
    assert not list(scratch.iterdir()), f"left behind: {[str(p) for p in scratch.rglob('*')]}"


def test_inline_pem_falls_back_to_a_private_directory_where_memory_files_are_refused(monkeypatch, tmp_path,
                                                                                       request):
    """A sandbox may refuse memfd_create (seccomp): the PEM then goes to a 0700
    directory of the temporary directory, removed at a normal exit."""
    def refused(*_args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(security_module, "_pem_paths", {})
    security_module._private_directory.cache_clear()  # a directory of this test's TMPDIR, and again after
    request.addfinalizer(security_module._private_directory.cache_clear)
    monkeypatch.setattr(os, "memfd_create", refused)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(security_module.tempfile, "tempdir", None)
    security = ClientSecurity.from_properties({"security.protocol": "SSL", "ssl.ca.pem": "-----BEGIN Y-----\n"})
    path = Path(security.ssl_cafile)
    assert path.parent.parent == tmp_path and path.parent.name.startswith("logbus-tls-")
    assert path.read_text() == "-----BEGIN Y-----\n" and path.stat().st_mode & 0o077 == 0


FALLBACK_THEN_FORK = """
import os, sys
from pathlib import Path
def refused(*_args):
    raise PermissionError(1, "Operation not permitted")
os.memfd_create = refused  # a sandbox without memory files: the private directory
from broker.client.security import ClientSecurity
security = ClientSecurity.from_properties({"security.protocol": "SSL", "ssl.ca.pem": "-----BEGIN Z-----\\n"})
if os.fork() == 0:
    sys.exit(0)  # a forked child that ends normally runs the atexit handlers it inherited
os.wait()
print(Path(security.ssl_cafile).exists(), flush=True)
"""


def test_a_forked_child_that_exits_normally_leaves_the_parents_pem_in_place(tmp_path):
    """The fallback directory is removed at exit by the process that made it only: a
    forked child (Airflow's task runner forks) inherits the atexit handler, and its
    normal exit removed the parent's PEM files while the parent still used them."""
    done = subprocess.run([sys.executable, "-c", FALLBACK_THEN_FORK], env={**os.environ, "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr
    assert not list(tmp_path.iterdir())  # and the parent's own exit removed it


def test_inline_pem_becomes_a_private_file():
    security = ClientSecurity.from_properties({"security.protocol": "SSL", "ssl.ca.pem": "-----BEGIN X-----\n"})
    path = Path(security.ssl_cafile)
    assert path.read_text() == "-----BEGIN X-----\n" and path.stat().st_mode & 0o077 == 0


def acl(name, principal, op, permission=Permission.ALLOW, pattern=PatternType.LITERAL):
    return Acl(Resource(ResourceType.TOPIC, name, pattern), AclEntry(principal, op, permission))


def test_acl_rule_deny_beats_allow_and_read_implies_describe():
    acls = [acl("orders", "User:alice", Operation.READ), acl("ord", "User:alice", Operation.WRITE,
                                                             pattern=PatternType.PREFIXED),
            acl("orders-secret", "User:alice", Operation.ALL, Permission.DENY)]
    assert decide(acls, "User:alice", Operation.READ, ResourceType.TOPIC, "orders") is True
    assert decide(acls, "User:alice", Operation.DESCRIBE, ResourceType.TOPIC, "orders") is True
    assert decide(acls, "User:alice", Operation.WRITE, ResourceType.TOPIC, "orders-2") is True  # prefixed
    assert decide(acls, "User:alice", Operation.WRITE, ResourceType.TOPIC, "orders-secret") is False  # deny wins
    assert decide(acls, "User:bob", Operation.READ, ResourceType.TOPIC, "orders") is None
    assert decide(acls, "User:alice", Operation.CREATE, ResourceType.TOPIC, "orders") is None
    everyone = [acl("*", "User:*", Operation.DESCRIBE)]
    assert decide(everyone, "User:carol", Operation.DESCRIBE, ResourceType.TOPIC, "anything") is True


def test_endpoints_parse_ipv6_and_refuse_garbage():
    assert parse_endpoints("CLIENT://[::1]:9094") == (Endpoint("CLIENT", "::1", 9094),)
    with pytest.raises(ValueError):
        parse_endpoints("CLIENT://host:99999")
