"""Brokers and clients reaching ZooKeeper over TLS (Debian's ZooKeeper 3.8 serving its
`secureClientPort` with Netty), beside TLS, SCRAM and ACLs to the brokers."""

from __future__ import annotations

import pytest

from broker.client.metadata import connect_zookeeper
from broker.client.consumer import SimpleConsumer
from broker.client.errors import ZooKeeperUnavailable
from broker.client.producer import Producer
from broker.client.security import ClientSecurity
from harness.certificates import CertificateAuthority
from harness.secured import CHROOT, SecuredCluster
from harness.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.slow


def test_brokers_and_clients_reach_zookeeper_over_tls(tmp_path):
    ca = CertificateAuthority(tmp_path / "ca")
    issued = ca.issue("zookeeper")
    keystore = tmp_path / "zookeeper-keystore.pem"
    keystore.write_text(issued.keyfile.read_text() + issued.certfile.read_text())
    keystore.chmod(0o600)
    with ZooKeeperServer(tmp_path / "zookeeper", tls=(keystore, ca.cafile)) as zookeeper:
        secured = SecuredCluster(tmp_path, zookeeper, ca=ca)
        try:
            secured.start(1)
            assert "use_ssl: True" in secured.cluster.brokers[0].log_tail(200)
            scram = secured.scram("admin", "admin-secret")
            client = ClientSecurity(scram.protocol, scram.listener, scram.ssl_cafile, sasl_username="admin",
                                   sasl_password="admin-secret", zookeeper_ssl_cafile=str(ca.cafile))
            over_tls = zookeeper.secure_connect_string + CHROOT
            with Producer(zookeeper=over_tls, security=client, monitoring=False, acks=-1) as producer:
                producer.send("over-tls", b"found through ZooKeeper's TLS port", partition=0)
            with SimpleConsumer("over-tls", 0, over_tls, security=client, max_wait_ms=200) as consumer:
                assert [m.value for m in consumer.fetch()] == [b"found through ZooKeeper's TLS port"]
            with pytest.raises(ZooKeeperUnavailable):  # a plaintext client on the TLS port gets nowhere
                connect_zookeeper(over_tls, timeout=3)
        finally:
            secured.stop()
