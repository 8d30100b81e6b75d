"""ACLs as every broker enforces them (`broker.common.acls` holds the model and the
rule): read from ZooKeeper and kept current by watches, so a change made with
`logbus acls` reaches every broker within a watch's round trip; decisions cached per
principal, operation and resource until the ACLs change.

Super-users (`super.users`) may do anything. With `allow.everyone.if.no.acl.found`, a
resource that no ACL names is open (Kafka's migration aid); off by default. Every
denial is logged, once per principal, operation and resource a minute."""

from __future__ import annotations

import logging
import threading
import time

from kazoo.client import KazooClient
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from broker.common.acls import (
    CLUSTER, Acl, Operation, PatternType, Permission, Resource, ResourceType, decide, decode_entries,
    resource_from_path,
)
from broker.common.errors import ClusterAuthorizationFailed, GroupAuthorizationFailed, TopicAuthorizationFailed
from broker.common.zklayout import ACLS
from broker.server.auth.session import Session

logger = logging.getLogger(__name__)

DENIAL_LOG_INTERVAL_S = 60.0
CACHE_MAX = 100_000
_REFUSAL = {ResourceType.TOPIC: TopicAuthorizationFailed, ResourceType.GROUP: GroupAuthorizationFailed,
            ResourceType.CLUSTER: ClusterAuthorizationFailed}


class Authorizer:
    def __init__(self, zk: KazooClient, super_users: tuple[str, ...], allow_if_no_acl: bool) -> None:
        self.zk = zk
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self._entries: dict[Resource, list] = {}  # replaced whole by watches
        # the ACLs and the decisions made on them, replaced together: a decision reached
        # on old ACLs goes into their cache, never into the new one
        self._view: tuple[list[Acl], dict[tuple, bool]] = ([], {})
        self._watched: set[str] = set()
        self._lock = threading.Lock()
        self._denials: dict[tuple, float] = {}

    def start(self) -> None:
        for pattern in PatternType:
            for resource_type in ResourceType:
                path = f"{ACLS}/{pattern.value}/{resource_type.value}"
                self.zk.retry(self.zk.ensure_path, path)  # a lost connection must not end the start
                ChildrenWatch(self.zk, path, self._children_watcher(pattern.value, resource_type.value))

    def _children_watcher(self, pattern: str, resource_type: str):
        def watch(children: list[str]) -> None:
            for name in children:
                resource = resource_from_path(pattern, resource_type, name)
                with self._lock:
                    if resource.path in self._watched:
                        continue
                    self._watched.add(resource.path)
                DataWatch(self.zk, resource.path, self._data_watcher(resource))
        return watch

    def _data_watcher(self, resource: Resource):
        def watch(data: bytes | None, stat: object) -> bool | None:
            with self._lock:
                entries = dict(self._entries)
                if data is None:
                    entries.pop(resource, None)
                    self._watched.discard(resource.path)
                else:
                    try:
                        entries[resource] = decode_entries(data)
                    except (ValueError, KeyError, TypeError):
                        logger.error("ignoring unreadable ACL node %s: %r", resource.path, data[:200])
                        return None
                self._entries = entries
                self._view = ([Acl(r, e) for r, es in entries.items() for e in es], {})
            logger.info("ACLs of %s now: %s", resource, ", ".join(str(Acl(resource, e)) for e in
                                                                 entries.get(resource, ())) or "none")
            return False if data is None else None
        return watch

    # ----------------------------------------------------------------- decisions

    def allowed(self, session: Session, operation: Operation, resource_type: ResourceType, name: str,
                log: bool = True) -> bool:
        """The decision; a denial is logged unless `log` is off (a first of two ways
        to be allowed, such as Create on the cluster before Create on the topic)."""
        verdict = self._verdict(session, operation, resource_type, name)
        if not verdict and log:
            self._log_denial(session, operation, resource_type, name)
        return verdict

    def _verdict(self, session: Session, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        key = (session.principal, session.host, operation, resource_type, name)
        acls, cache = self._view
        verdict = cache.get(key)
        if verdict is None:
            verdict = self._decide(acls, session, operation, resource_type, name)
            if len(cache) > CACHE_MAX:
                cache.clear()
            cache[key] = verdict
        return verdict

    def _decide(self, acls: list[Acl], session: Session, operation: Operation, resource_type: ResourceType,
                name: str) -> bool:
        if session.principal in self.super_users:
            return True
        verdict = decide(acls, session.principal, operation, resource_type, name, session.host)
        if verdict is None:
            named = any(a.resource.matches(resource_type, name) for a in acls)
            return self.allow_if_no_acl and not named
        return verdict

    def check(self, session: Session, operation: Operation, resource_type: ResourceType, name: str) -> None:
        """Raise the refusal of its resource type unless allowed."""
        if not self.allowed(session, operation, resource_type, name):
            what = "the cluster" if resource_type == ResourceType.CLUSTER else f"{resource_type.value} {name!r}"
            raise _REFUSAL[resource_type](f"{session.principal} may not {operation.value} {what}")

    def check_cluster(self, session: Session, operation: Operation) -> None:
        self.check(session, operation, ResourceType.CLUSTER, CLUSTER)

    def may_write_somewhere(self, session: Session) -> bool:
        """An idempotent producer's id is for principals that may write (Kafka's
        IdempotentWrite: Write on the cluster or on any topic)."""
        if self._verdict(session, Operation.WRITE, ResourceType.CLUSTER, CLUSTER):
            return True
        return any(a.entry.permission == Permission.ALLOW and a.resource.type == ResourceType.TOPIC
                   and a.entry.operation in (Operation.WRITE, Operation.ALL)
                   and a.entry.principal in (session.principal, "User:*") for a in self._view[0])

    def _log_denial(self, session: Session, operation: Operation, resource_type: ResourceType, name: str) -> None:
        key = (session.principal, operation, resource_type, name)
        now = time.monotonic()
        if now - self._denials.get(key, -DENIAL_LOG_INTERVAL_S) < DENIAL_LOG_INTERVAL_S:
            return
        if len(self._denials) > CACHE_MAX:
            self._denials.clear()
        self._denials[key] = now
        logger.warning("denied: %s from %s may not %s %s %r (logged once a minute)", session.principal, session.host,
                       operation.value, resource_type.value, name)
