"""Who calls, and what they may do (docs/schemas.md, "Security"): HTTP Basic checked
against the cluster's SCRAM users (`broker.common.passwords`, the check SASL/PLAIN
makes: no password stored, unknown users indistinguishable), and the cluster's ACLs
on subjects (`broker.common.acls`, resource type `subject`): Read to see a subject
and its schemas, Write to register, delete or set its level; Alter on the cluster to
set the global level. Super-users may do anything. An open registry (no
authentication) checks nothing, as a cluster without an authorizer.

ACLs are read from ZooKeeper at every check, so a grant holds at the next request."""

from __future__ import annotations

import base64
import binascii
import logging

from broker.common.acls import CLUSTER, Operation, ResourceType, decide, read_acls
from broker.common.passwords import ClusterCredentials, password_matches
from broker.registry.errors import forbidden, unauthenticated

logger = logging.getLogger(__name__)

ANONYMOUS = "User:ANONYMOUS"
REFUSED = "Unauthorized: valid HTTP Basic credentials of a cluster user are required"


class Access:
    """`credentials` None: an open registry."""

    def __init__(self, credentials: ClusterCredentials | None, super_users: tuple[str, ...] = ()) -> None:
        self.credentials = credentials
        self.super_users = frozenset(super_users)

    @property
    def secured(self) -> bool:
        return self.credentials is not None

    def principal(self, authorization: str | None) -> str:
        """The caller's principal from an `Authorization` header; 401 if the registry is
        secured and the header is missing, malformed or wrong — one answer for all."""
        if not self.secured:
            return ANONYMOUS
        scheme, _, encoded = (authorization or "").partition(" ")
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user, sep, password = "", "", ""
        if scheme.lower() != "basic" or not sep or not user or not password:
            raise unauthenticated(REFUSED)
        if not password_matches(self.credentials.lookup, user, password):
            logger.info("HTTP Basic authentication of user %r refused", user)
            raise unauthenticated(REFUSED)
        return f"User:{user}"

    def allowed(self, principal: str, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        if not self.secured or principal in self.super_users:
            return True
        return bool(decide(read_acls(self.credentials.zk), principal, operation, resource_type, name))

    def require(self, principal: str, operation: Operation, subject: str) -> None:
        if not self.allowed(principal, operation, ResourceType.SUBJECT, subject):
            raise forbidden(principal, operation.value, f"subject '{subject}'")

    def require_cluster(self, principal: str, operation: Operation) -> None:
        if not self.allowed(principal, operation, ResourceType.CLUSTER, CLUSTER):
            raise forbidden(principal, operation.value, "the cluster (the global compatibility level)")

    def visible(self, principal: str, subjects: list[str]) -> list[str]:
        """The subjects the principal may see (Describe: Read or Write imply it)."""
        if not self.secured or principal in self.super_users:
            return subjects
        acls = read_acls(self.credentials.zk)
        return [s for s in subjects if decide(acls, principal, Operation.DESCRIBE, ResourceType.SUBJECT, s)]

    def require_any(self, principal: str, subjects: list[str], what: str) -> None:
        """Read on at least one of `subjects` (those that use a schema id)."""
        if not self.secured or principal in self.super_users:
            return
        acls = read_acls(self.credentials.zk)
        if not any(decide(acls, principal, Operation.READ, ResourceType.SUBJECT, s) for s in subjects):
            raise forbidden(principal, Operation.READ.value, what)

