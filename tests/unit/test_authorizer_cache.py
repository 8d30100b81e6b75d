"""The authorizer's cached decisions against ACL changes that arrive meanwhile: a
decision reached on the old ACLs must not outlive them (it would stand until the next
change to any ACL)."""

from __future__ import annotations

from broker.common.acls import AclEntry, Operation, Permission, Resource, ResourceType, encode_entries
from broker.server.auth import authorizer as module
from broker.server.auth.authorizer import Authorizer
from broker.server.auth.session import Session

TOPIC = Resource(ResourceType.TOPIC, "clicks")
BOB = Session(listener=None, host="10.0.0.7", principal="User:bob")  # type: ignore[arg-type]


def test_a_grant_applied_while_a_denial_is_being_decided_is_not_hidden_by_it(monkeypatch):
    auth = Authorizer(zk=None, super_users=(), allow_if_no_acl=False)  # type: ignore[arg-type]
    apply_grant = auth._data_watcher(TOPIC)
    decide = module.decide

    def grant_lands_midway(*args, **kwargs):
        verdict = decide(*args, **kwargs)  # decided on the ACLs as they were: no grant
        apply_grant(encode_entries([AclEntry("User:bob", Operation.READ, Permission.ALLOW)]), None)
        return verdict

    monkeypatch.setattr(module, "decide", grant_lands_midway)
    assert not auth.allowed(BOB, Operation.READ, ResourceType.TOPIC, "clicks", log=False)
    monkeypatch.setattr(module, "decide", decide)
    assert auth.allowed(BOB, Operation.READ, ResourceType.TOPIC, "clicks", log=False), "the grant is in force"


def test_a_revocation_ends_a_cached_grant():
    auth = Authorizer(zk=None, super_users=(), allow_if_no_acl=False)  # type: ignore[arg-type]
    watch = auth._data_watcher(TOPIC)
    watch(encode_entries([AclEntry("User:bob", Operation.READ, Permission.ALLOW)]), None)
    assert auth.allowed(BOB, Operation.READ, ResourceType.TOPIC, "clicks", log=False)
    watch(None, None)
    assert not auth.allowed(BOB, Operation.READ, ResourceType.TOPIC, "clicks", log=False)
