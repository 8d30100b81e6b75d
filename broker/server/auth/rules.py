"""What each request needs (the table in docs/operations.md, "Securing a cluster"),
asked by the request handlers; on an open cluster (no authorizer) nothing is checked
and every method returns at once."""

from __future__ import annotations

from typing import Callable

from broker.common.acls import CLUSTER, Operation, ResourceType
from broker.common.errors import ClusterAuthorizationFailed, LogbusError
from broker.common.protocol import BrokerInfo
from broker.server.auth.authorizer import Authorizer
from broker.server.auth.session import Session


class RequestRules:
    def __init__(self, authorizer: Authorizer | None, brokers: Callable[[], dict[int, BrokerInfo]]) -> None:
        self.authorizer = authorizer
        self.brokers = brokers  # the live brokers and their registered principals

    def topic(self, session: Session, operation: Operation, topic: str) -> None:
        """Read, Write or Describe on a topic, or TopicAuthorizationFailed."""
        if self.authorizer is not None:
            self.authorizer.check(session, operation, ResourceType.TOPIC, topic)

    def reads(self, session: Session, topic: str) -> bool:
        """Whether the principal may read the topic (a Kafka group's commits and fetches,
        refused per partition)."""
        return self.authorizer is None or self.authorizer.allowed(session, Operation.READ, ResourceType.TOPIC, topic)

    def group(self, session: Session, operation: Operation, group: str) -> None:
        """Read (join, sync, heartbeat, leave, commit, fetch offsets) or Describe
        (FindCoordinator, DescribeGroups) on a Kafka group, or GroupAuthorizationFailed."""
        if self.authorizer is not None:
            self.authorizer.check(session, operation, ResourceType.GROUP, group)

    def may_group(self, session: Session, operation: Operation, group: str) -> bool:
        """The same decision as a bool, unlogged (ListGroups' filter, authorized operations)."""
        return self.authorizer is None or self.authorizer.allowed(session, operation, ResourceType.GROUP, group,
                                                                  log=False)

    def topic_refusal(self, session: Session, operation: Operation, topic: str) -> LogbusError | None:
        """`topic`'s check as a value: the refusal, or None (per-partition answers)."""
        try:
            self.topic(session, operation, topic)
        except LogbusError as exc:
            return exc
        return None

    def describes(self, session: Session, topic: str) -> bool:
        """Whether METADATA shows the topic to this principal."""
        return self.authorizer is None or self.authorizer.allowed(session, Operation.DESCRIBE, ResourceType.TOPIC,
                                                                  topic)

    def create(self, session: Session, topic: str) -> None:
        """Create on the cluster or on the topic (an auto-create by a first produce too)."""
        authorizer = self.authorizer
        if authorizer is not None and not authorizer.allowed(session, Operation.CREATE, ResourceType.CLUSTER, CLUSTER,
                                                             log=False):
            authorizer.check(session, Operation.CREATE, ResourceType.TOPIC, topic)

    def delete(self, session: Session, topic: str) -> None:
        """Delete on the topic (Kafka's DELETE on TOPIC; All implies it), whether or not it
        exists: a principal that may not delete it learns nothing of it."""
        if self.authorizer is not None:
            self.authorizer.check(session, Operation.DELETE, ResourceType.TOPIC, topic)

    def describe_configs(self, session: Session, resource_type: ResourceType, name: str) -> None:
        """DescribeConfigs on the topic, or on the cluster for the broker's settings
        (`name` is ignored for the cluster: there is one)."""
        if self.authorizer is not None:
            self.authorizer.check(session, Operation.DESCRIBE_CONFIGS, resource_type,
                                  CLUSTER if resource_type == ResourceType.CLUSTER else name)

    def producer_id(self, session: Session) -> None:
        if self.authorizer is not None and not self.authorizer.may_write_somewhere(session):
            raise ClusterAuthorizationFailed(f"{session.principal} may write to no topic: no producer id for it")

    def replica(self, session: Session, replica_id: int | None) -> None:
        """Replication requests: ClusterAction, and from the broker whose id they name
        (any broker, for LEADER_EPOCH_END, which names none) — a client naming a
        follower must not move the high watermark (docs/replication.md)."""
        if self.authorizer is None:
            return
        self.authorizer.check_cluster(session, Operation.CLUSTER_ACTION)
        brokers = self.brokers()
        candidates = brokers.values() if replica_id is None else filter(None, [brokers.get(replica_id)])
        if not any(b.principal and b.principal == session.principal for b in candidates):
            who = "any broker" if replica_id is None else f"broker {replica_id}"
            raise ClusterAuthorizationFailed(f"{session.principal} is not {who}'s registered principal")
