"""The cluster's SCRAM settings in ZooKeeper (`broker.common.credentials.ScramSettings`):
made once whoever asks first, private to the cluster's identity, and the count every
user is stored with. Real ZooKeeper, a chroot per test."""

from __future__ import annotations

import threading

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from broker.common.credentials import ScramSettings, cluster_settings, read_credential, set_password
from broker.common.zkauth import ZooKeeperAuth
from broker.common.zklayout import USERS

AUTH = ZooKeeperAuth("logbus:zk-secret", set_acl=True)


@pytest.fixture
def admin(zk_connect):
    client = KazooClient(zk_connect, **AUTH.client_kwargs())
    client.start(30)
    yield client
    client.stop()
    client.close()


def test_brokers_that_race_to_make_the_settings_all_get_one(zk_connect):
    clients = [KazooClient(zk_connect, **AUTH.client_kwargs()) for _ in range(4)]
    made: list[ScramSettings] = []
    start = threading.Barrier(len(clients))

    def make(client: KazooClient) -> None:
        start.wait()
        made.append(cluster_settings(client, AUTH.private_acl))

    try:
        for client in clients:
            client.start(30)
        threads = [threading.Thread(target=make, args=(client,)) for client in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for client in clients:
            client.stop()
            client.close()
    assert len(made) == len(clients) and len(set(made)) == 1
    assert made[0].iterations == 8192 and len(made[0].secret) == 32


def test_an_open_users_folder_is_closed_to_all_but_the_clusters_identity(admin, zk):
    admin.create(f"{USERS}/alice", b"{}", acl=AUTH.private_acl, makepath=True)
    admin.set_acls(USERS, OPEN_ACL_UNSAFE)  # as a cluster that turned zookeeper.set.acl on later has it
    assert zk.get_children(USERS) == ["alice"]
    cluster_settings(admin, AUTH.private_acl)
    with pytest.raises(NoAuthError):
        zk.get(USERS)  # the secret
    with pytest.raises(NoAuthError):
        zk.get_children(USERS)  # who the users are


def test_users_are_stored_with_the_clusters_count(admin):
    admin.create(USERS, ScramSettings(4096, b"s" * 32).encode(), acl=AUTH.private_acl)
    set_password(admin, "alice", "alice-secret", acl=AUTH.private_acl)
    assert read_credential(admin, "alice", "SCRAM-SHA-512").iterations == 4096
    assert len(read_credential(admin, "alice", "SCRAM-SHA-256").salt) == 32
