"""The ZooKeeper root's protection without a ZooKeeper: which ACL entries leave the
cluster's root open, how the cluster's identity is named in ACLs, and what
`protect_root` refuses before it asks ZooKeeper anything (broker/common/zkauth.py)."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.security import OPEN_ACL_UNSAFE, make_acl, make_digest_acl, make_digest_acl_credential

from broker.common.zkauth import NO_AUTH, UnprotectedRoot, ZooKeeperAuth, protect_root, root_openings

AUTH = ZooKeeperAuth("logbus:secret", set_acl=True)


def test_the_identity_is_named_as_zookeeper_names_digest_ids():
    assert AUTH.identity == make_digest_acl_credential("logbus", "secret")
    assert NO_AUTH.identity == ""


def test_the_clusters_own_acl_leaves_nothing_open():
    assert root_openings(AUTH.default_acl, AUTH.identity) == []
    assert root_openings(AUTH.private_acl, AUTH.identity) == []


@pytest.mark.parametrize("acl, opening", [
    (OPEN_ACL_UNSAFE, "world:anyone (ALL)"),
    ([make_acl("world", "anyone", create=True, read=True)], "world:anyone (READ,CREATE)"),
    ([make_acl("world", "anyone", delete=True)], "world:anyone (DELETE)"),
    ([make_acl("world", "anyone", admin=True)], "world:anyone (ADMIN)"),
    ([make_digest_acl("ops", "other", all=True)], "digest:ops:"),
    ([make_acl("ip", "10.0.0.1", create=True)], "ip:10.0.0.1 (CREATE)"),
])
def test_anyone_else_who_may_create_delete_or_change_the_acl_is_an_opening(acl, opening):
    openings = root_openings(AUTH.default_acl + acl, AUTH.identity)
    assert len(openings) == 1 and openings[0].startswith(opening), openings


def test_reading_and_writing_the_roots_own_data_is_no_opening():
    assert root_openings([make_acl("world", "anyone", read=True, write=True)], AUTH.identity) == []


def test_zookeepers_own_root_is_refused_naming_the_move():
    with pytest.raises(UnprotectedRoot, match="ZooKeeper's own root.*protect-root --copy-from /"):
        protect_root(KazooClient("127.0.0.1:1"), AUTH)  # never started: refused before any call


def test_protecting_needs_the_clusters_identity():
    with pytest.raises(UnprotectedRoot, match="zookeeper.auth=user:password"):
        protect_root(KazooClient("127.0.0.1:1/logbus"), ZooKeeperAuth("logbus:secret"))
