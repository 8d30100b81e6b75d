"""The requests about the cluster's topics rather than their data: METADATA (who
leads what, at which address), CREATE_TOPIC, with the auto-creation a first produce
triggers, and DELETE_TOPIC (the Kafka listener's CreateTopics and DeleteTopics use the
same checks and steps). They read the registry's view of ZooKeeper, never a log's bytes.
"""

from __future__ import annotations

import asyncio

from kazoo.client import KazooClient
from kazoo.recipe.watchers import DataWatch

from broker.common.errors import (
    ErrorCode, InvalidReplicationFactor, InvalidRequest, LogbusError, RequestTimedOut, TopicCreationDisabled,
    TopicDeletionDisabled, UnknownTopic,
)
from broker.common.partitionstates import live_leader
from broker.common.protocol import (
    AUTO_PARTITIONS, Body, BrokerInfo, CreateTopicRequest, DeleteTopicRequest, MetadataRequest, MetadataResponse, PartitionMetadata,
    Reader, TopicMetadata, check_topic_name,
)
from broker.common.topicdeletion import mark_for_deletion
from broker.common.zklayout import deletion_path
from broker.server.auth.rules import RequestRules
from broker.server.auth.session import Session
from broker.server.config import BrokerConfig
from broker.server.log.manager import LogManager
from broker.server.registration import BrokerRegistry
from broker.server.replies import Reply, answered, later

MAX_PARTITIONS = 10_000


class TopicRequests:
    def __init__(self, config: BrokerConfig, registry: BrokerRegistry, logs: LogManager, rules: RequestRules) -> None:
        self.config = config
        self.registry = registry
        self.logs = logs
        self.rules = rules

    def metadata(self, reader: Reader, session: Session, version: int = 0) -> Reply:
        """Leaders come from the partition state nodes (the controller's decisions): -1
        for an offline partition or a leader that is not registered. Version 1 adds
        each partition's leader epoch and ISR. Brokers are given at the addresses of
        the listener asked on; topics the principal may not describe are left out of
        a list of all, and refused by name when asked for."""
        req = MetadataRequest.decode(reader)
        view = self.registry.view
        topics = []
        for topic in req.topics or sorted(view.topics):
            if not self.rules.describes(session, topic):
                if req.topics:
                    topics.append(TopicMetadata(topic, ErrorCode.TOPIC_AUTHORIZATION_FAILED, []))
                continue
            assignment = view.topics.get(topic)
            if assignment is None:
                try:
                    check_topic_name(topic)
                except LogbusError as exc:  # a name no topic can have is not merely unknown
                    topics.append(TopicMetadata(topic, exc.code, []))
                else:
                    topics.append(TopicMetadata(topic, ErrorCode.UNKNOWN_TOPIC, []))
                continue
            partitions = []
            for partition, replicas in sorted(assignment.items()):
                state = self.registry.states.get(topic, partition, replicas)
                leader = live_leader(state, view.brokers)
                log = self.logs.get(topic, partition) if leader == self.config.broker_id else None
                earliest, latest = (log.start_offset, log.visible_offset) if log else (-1, -1)
                partitions.append(PartitionMetadata(partition, leader, replicas, earliest, latest,
                                                    state.leader_epoch, list(state.isr)))
            topics.append(TopicMetadata(topic, 0, partitions))
        brokers = [self._reachable(b, session.listener.name) for b in sorted(view.brokers.values(),
                                                                          key=lambda b: b.broker_id)]
        return answered([MetadataResponse([b for b in brokers if b is not None], topics).encode(version)])

    @staticmethod
    def _reachable(broker: BrokerInfo, listener: str) -> BrokerInfo | None:
        """A broker as reached on `listener` (brokers registered before listeners have
        one address); None when it does not serve that listener."""
        if not broker.endpoints:
            return broker
        try:
            return broker.at(listener)
        except ConnectionError:
            return None

    def create_topic(self, reader: Reader, session: Session) -> Reply:
        req = CreateTopicRequest.decode(reader)
        check_topic_name(req.topic)
        self.rules.create(session, req.topic)
        if req.partitions == AUTO_PARTITIONS:
            return later(self._auto_create_topic(req.topic))
        if not 1 <= req.partitions <= MAX_PARTITIONS:
            raise InvalidRequest(
                f"partitions must be 1..{MAX_PARTITIONS}, or {AUTO_PARTITIONS} for the broker's num.partitions, "
                f"not {req.partitions}"
            )
        if req.replication_factor < -1:
            raise InvalidReplicationFactor(
                f"replication factor {req.replication_factor}: must be >= 1, or 0/-1 for default.replication.factor")
        return later(self._create_topic(req))

    async def _auto_create_topic(self, topic: str) -> Body:
        """Clients that learn a topic is missing ask for it to be created exactly as a
        first produce would: num.partitions, only if auto.create.topics is on, and an
        existing topic is success."""
        if topic not in self.registry.view.topics:
            await self.auto_create(topic)
        return []

    async def _create_topic(self, req: CreateTopicRequest) -> Body:
        loop = asyncio.get_running_loop()
        factor = req.replication_factor if req.replication_factor > 0 else self.config.default_replication_factor
        await loop.run_in_executor(None, self.registry.create_topic, req.topic, req.partitions, factor)
        return []

    async def auto_create(self, topic: str) -> None:
        """Create `topic` as a first produce to it would: num.partitions, only if
        auto.create.topics is on."""
        check_topic_name(topic)
        if not self.config.auto_create_topics:
            raise TopicCreationDisabled(f"unknown topic {topic!r} (auto.create.topics is off)")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.registry.ensure_topic, topic, self.config.num_partitions,
                                   self.config.default_replication_factor)

    def delete_topic(self, reader: Reader, session: Session) -> Reply:
        req = DeleteTopicRequest.decode(reader)
        self.check_deletion(session, req.topic)
        return later(self._delete_topic(req))

    async def _delete_topic(self, req: DeleteTopicRequest) -> Body:
        await self.delete(req.topic, req.timeout_ms / 1000)
        return []

    def check_deletion(self, session: Session, topic: str) -> None:
        """The refusals of a deletion, in the order that says the most and shows a topic
        only to who may delete it: the name, Delete on the topic, its existence, then
        `delete.topic.enable`."""
        check_topic_name(topic)
        self.rules.delete(session, topic)
        if topic not in self.registry.view.topics:
            raise UnknownTopic(f"unknown topic {topic!r}")
        if not self.config.delete_topic_enable:
            raise TopicDeletionDisabled(f"topic {topic!r} not deleted: delete.topic.enable is off on broker "
                                        f"{self.config.broker_id}")

    async def delete(self, topic: str, timeout_s: float) -> None:
        """Mark the topic for deletion (the controller carries it out: broker.server.topicdeleter)
        and wait until it is complete — its marker gone — for at most `timeout_s`
        seconds (<= 0: answer once marked); RequestTimedOut after that, and the
        deletion goes on."""
        loop = asyncio.get_running_loop()
        zk = self.registry.zk
        await loop.run_in_executor(None, mark_for_deletion, zk, topic)
        if timeout_s <= 0:
            return
        done = loop.create_future()
        await loop.run_in_executor(None, _when_deleted, zk, topic, lambda: loop.call_soon_threadsafe(_resolve, done))
        try:
            await asyncio.wait_for(done, timeout_s)
        except asyncio.TimeoutError:
            raise RequestTimedOut(f"topic {topic!r} is marked for deletion, but the deletion was not complete within "
                                  f"{timeout_s * 1000:.0f} ms; it goes on") from None


def _when_deleted(zk: KazooClient, topic: str, then) -> None:
    """Call `then` once the topic's deletion marker is gone (from kazoo's thread)."""
    def watch(data: bytes | None, stat: object) -> bool | None:
        if data is None and stat is None:
            then()
            return False
        return None

    DataWatch(zk, deletion_path(topic), watch)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
