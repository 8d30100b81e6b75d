"""A secured cluster for tests and benchmarks (docs/operations.md, "Securing a
cluster"): its own ZooKeeper with digest ACLs on the brokers' nodes, a certificate
authority made on the spot, and brokers with four listeners each —

    INTERNAL  SASL_SSL        brokers to each other, as users broker-<id>
    CLIENT    SASL_SSL        clients with SCRAM users
    MTLS      SSL             clients with certificates (principal: the subject)
    PLAIN     PLAINTEXT       anyone, as User:ANONYMOUS

— an authorizer, and super-users admin and the brokers. Passwords reach the brokers
in a file of mode 0600 (`harness.cluster`), never on their command line. Its nodes
live under a ZooKeeper root of its own, `/logbus`, made the cluster's before anything
else (`broker.common.zkauth.protect_root`, as `logbus zookeeper protect-root` does)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Iterator

from kazoo.client import KazooClient

from broker.client.security import ClientSecurity
from broker.common.acls import (
    CLUSTER, Acl, AclEntry, Operation, PatternType, Permission, Resource, ResourceType, change_acls,
)
from broker.common.credentials import set_password
from broker.common.zkauth import ZooKeeperAuth, protect_root
from harness.certificates import CertificateAuthority
from harness.cluster import BrokerProcess, LocalCluster
from harness.process import free_port, wait_until
from harness.zookeeper import ZooKeeperServer

ZOOKEEPER_AUTH = "logbus:zookeeper-secret"
CHROOT = "/logbus"
LISTENERS = ("INTERNAL", "CLIENT", "MTLS", "PLAIN")
PROTOCOLS = "INTERNAL:SASL_SSL,CLIENT:SASL_SSL,MTLS:SSL,PLAIN:PLAINTEXT"


class SecuredCluster:
    def __init__(self, workdir: Path, zookeeper: ZooKeeperServer, settings: dict[str, object] | None = None,
                 ca: CertificateAuthority | None = None, chroot: str = CHROOT) -> None:
        """With a `zookeeper` serving TLS (`ZooKeeperServer(tls=...)`, its certificate from
        `ca`), the brokers reach it on its TLS port. `chroot=""` keeps the cluster at
        ZooKeeper's own root, as before issue 34 (a test moves such a cluster);
        `connect_string` is where clients find the cluster."""
        self.workdir = Path(workdir)
        self.zookeeper = zookeeper
        self.ca = ca or CertificateAuthority(self.workdir / "ca")
        self.auth = ZooKeeperAuth(ZOOKEEPER_AUTH, set_acl=True)
        self.connect_string = zookeeper.connect_string + chroot
        if chroot:  # the cluster's own before anyone connects under it
            root_zk = KazooClient(zookeeper.connect_string, **self.auth.client_kwargs())
            root_zk.start(30)
            try:
                protect_root(root_zk, self.auth, chroot)
            finally:
                root_zk.stop()
                root_zk.close()
        zookeeper_tls = getattr(zookeeper, "secure_port", None) is not None
        self.cluster = LocalCluster(self.connect_string, self.workdir, broker_zookeeper=(
            zookeeper.secure_connect_string + chroot if zookeeper_tls else None), settings={
            **({"zookeeper.ssl.cafile": self.ca.cafile} if zookeeper_tls else {}),
            "listener.security.protocol.map": PROTOCOLS, "inter.broker.listener.name": "INTERNAL",
            "ssl.cafile": self.ca.cafile, "ssl.client.auth": "requested",
            "authorizer.enable": "true", "zookeeper.set.acl": "true", "zookeeper.auth": ZOOKEEPER_AUTH,
            **(settings or {}),
        })
        self.ports: dict[int, dict[str, int]] = {}
        self.admin_zk = KazooClient(self.connect_string, **self.auth.client_kwargs())
        self.admin_zk.start(30)
        self.add_user("admin", "admin-secret")

    # ------------------------------------------------------------------ brokers

    def start_broker(self, broker_id: int, settings: dict[str, object] | None = None) -> BrokerProcess:
        if broker_id not in self.ports:
            self.ports[broker_id] = {name: free_port() for name in LISTENERS}
            self.add_user(f"broker-{broker_id}", f"broker-{broker_id}-secret")
        ports = self.ports[broker_id]
        issued = self.ca.issue(f"broker-{broker_id}")
        listeners = ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items())
        supers = ";".join(["User:admin"] + [f"User:broker-{b}" for b in sorted(self.ports)])
        return self.cluster.start_broker(broker_id, {
            "listeners": listeners, "ssl.certfile": issued.certfile, "ssl.keyfile": issued.keyfile,
            "inter.broker.sasl.username": f"broker-{broker_id}",
            "inter.broker.sasl.password": f"broker-{broker_id}-secret",
            "super.users": supers, **(settings or {}),
        }, port=ports["INTERNAL"])

    def start(self, count: int) -> "SecuredCluster":
        for broker_id in range(count):
            self.ports[broker_id] = {name: free_port() for name in LISTENERS}
            self.add_user(f"broker-{broker_id}", f"broker-{broker_id}-secret")
        for broker_id in range(count):
            self.start_broker(broker_id)
        return self

    def address(self, broker_id: int, listener: str) -> tuple[str, int]:
        return "127.0.0.1", self.ports[broker_id][listener]

    # ------------------------------------------------------------- principals

    def add_user(self, user: str, password: str) -> None:
        set_password(self.admin_zk, user, password, acl=self.auth.private_acl)

    def scram(self, user: str, password: str, listener: str = "CLIENT") -> ClientSecurity:
        return ClientSecurity("SASL_SSL", listener, str(self.ca.cafile), sasl_username=user, sasl_password=password)

    def certificate(self, name: str, listener: str = "MTLS") -> ClientSecurity:
        issued = self.ca.issue(name)
        return ClientSecurity("SSL", listener, str(self.ca.cafile), str(issued.certfile), str(issued.keyfile))

    def allow(self, principal: str, operation: Operation, resource_type: ResourceType = ResourceType.TOPIC,
              name: str = CLUSTER, pattern: PatternType = PatternType.LITERAL,
              permission: Permission = Permission.ALLOW) -> None:
        """Add an ACL entry and return once every running broker has applied it (brokers
        learn of ACLs through watches, a round trip or more after the write)."""
        resource, entry = Resource(resource_type, name, pattern), AclEntry(principal, operation, permission)
        marks = {broker: broker.log_size() for broker in self.cluster.brokers.values() if broker.alive}
        change_acls(self.admin_zk, resource, add=[entry], acl=self.auth.default_acl)
        applied = str(Acl(resource, entry))  # in the line the authorizer logs on each change
        wait_until(lambda: all(broker.logged_since(mark, applied) for broker, mark in marks.items()), 30,
                   f"every broker to apply {applied}")

    def stop(self) -> None:
        try:
            self.cluster.stop()
        finally:
            self.admin_zk.stop()
            self.admin_zk.close()


@contextlib.contextmanager
def secured_cluster(brokers: int, workdir: Path | None = None,
                    settings: dict[str, object] | None = None) -> Iterator[SecuredCluster]:
    """A started secured cluster; stopped, and its scratch directory removed, after."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="logbus-secured-")))
        zookeeper = stack.enter_context(ZooKeeperServer(Path(workdir) / "zookeeper"))
        cluster = SecuredCluster(workdir, zookeeper, settings)
        stack.callback(cluster.stop)
        yield cluster.start(brokers)
