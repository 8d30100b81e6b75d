"""OffsetCommit and OffsetFetch of the Kafka listener (docs/kafka.md, "Consumer groups"),
every served version's shape: the group's refusal (ACL, group id, coordinator) on every
partition, then per partition Read on its topic (TOPIC_AUTHORIZATION_FAILED) and, for a
commit, a partition that exists and an offset that can be one. Offsets live where
native groups keep theirs (`GroupStore`), written only by a commit the coordinator
accepts from a member of the group's current generation.

What Kafka keeps beside an offset and logbus does not: the commit's metadata string
(OffsetFetch answers "") and the leader epoch (-1): the offset nodes hold the decimal
offset every native reader expects.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta

from broker.common.kafka.apis import ApiKey
from broker.server.auth.rules import RequestRules
from broker.server.auth.session import Session
from broker.server.kafka.coordinator import GroupCoordinator
from broker.server.kafka.groupstore import CoordinatorFenced, TopicPartition
from broker.server.kafka.messages import entity, response
from broker.server.registration import BrokerRegistry

logger = logging.getLogger(__name__)

OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes: longer metadata is refused, as there
NO_OFFSET = -1
NO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))


class OffsetRequests:
    def __init__(self, coordinator: GroupCoordinator, registry: BrokerRegistry, rules: RequestRules) -> None:
        self.coordinator = coordinator
        self.registry = registry
        self.rules = rules

    # ---------------------------------------------------------------- commit

    async def commit(self, request: Any, version: int, session: Session, refusal: ErrorCode | None) -> Any:
        group_id = request.group_id
        if refusal is None:
            refusal = self.coordinator.commit_error(group_id, request.generation_id_or_member_epoch, request.member_id)
            if refusal not in (None, ErrorCode.none):
                logger.info("group %s: commit by member %r of generation %d refused: %s", group_id,
                            request.member_id, request.generation_id_or_member_epoch, refusal.name)
            else:
                refusal = None
        errors: dict[TopicPartition, ErrorCode] = {}
        offsets: dict[TopicPartition, int] = {}
        for topic in request.topics:
            for p in topic.partitions:
                key = (topic.name, p.partition_index)
                errors[key] = refusal or self._partition_error(session, topic.name, p)
                if errors[key] == ErrorCode.none:
                    offsets[key] = p.committed_offset
        if offsets:
            stored = await self._store(group_id, offsets)
            errors.update({key: stored for key in offsets})
        return response(ApiKey.OFFSET_COMMIT, version, throttle_time=NO_THROTTLE, topics=tuple(
            entity(ApiKey.OFFSET_COMMIT, version, "OffsetCommitResponseTopic", name=topic.name, partitions=tuple(
                entity(ApiKey.OFFSET_COMMIT, version, "OffsetCommitResponsePartition", partition_index=p.partition_index,
                       error_code=errors[(topic.name, p.partition_index)]) for p in topic.partitions))
            for topic in request.topics))

    def _partition_error(self, session: Session, topic: str, partition: Any) -> ErrorCode:
        if not self.rules.reads(session, topic):
            return ErrorCode.topic_authorization_failed
        if partition.partition_index not in self.registry.view.topics.get(topic, {}):
            return ErrorCode.unknown_topic_or_partition
        if partition.committed_offset < 0:
            return ErrorCode.invalid_commit_offset_size
        if len((partition.committed_metadata or "").encode()) > OFFSET_METADATA_MAX_BYTES:
            return ErrorCode.offset_metadata_too_large
        return ErrorCode.none

    async def _store(self, group_id: str, offsets: dict[TopicPartition, int]) -> ErrorCode:
        epoch_version = self.coordinator.epoch_version
        if epoch_version is None:
            return ErrorCode.not_coordinator
        try:
            await self.coordinator.store.call(self.coordinator.store.commit, group_id, offsets, epoch_version)
            return ErrorCode.none
        except CoordinatorFenced as exc:
            logger.warning("group %s: commit refused, not the coordinator any more (%s)", group_id, exc)
            self.coordinator.drop_all()
            self.coordinator.roles.stale()
            return ErrorCode.not_coordinator
        except Exception as exc:
            logger.warning("group %s: storing offsets in ZooKeeper failed: %s", group_id, exc)
            return ErrorCode.coordinator_not_available

    # ----------------------------------------------------------------- fetch

    async def fetch(self, request: Any, version: int, session: Session, refusals: list[ErrorCode | None]) -> Any:
        if version >= 8:
            groups = [await self._group(version, g.group_id, g.topics, session, refusal, "OffsetFetchResponseTopics",
                                        "OffsetFetchResponsePartitions")
                      for g, refusal in zip(request.groups, refusals)]
            return response(ApiKey.OFFSET_FETCH, version, throttle_time=NO_THROTTLE, groups=tuple(
                entity(ApiKey.OFFSET_FETCH, version, "OffsetFetchResponseGroup", group_id=g.group_id, topics=topics,
                       error_code=error) for g, (topics, error) in zip(request.groups, groups)))
        topics, error = await self._group(version, request.group_id, request.topics, session, refusals[0],
                                          "OffsetFetchResponseTopic", "OffsetFetchResponsePartition")
        return response(ApiKey.OFFSET_FETCH, version, throttle_time=NO_THROTTLE, topics=topics, error_code=error)

    async def _group(self, version: int, group_id: str, asked: Any, session: Session, refusal: ErrorCode | None,
                     topic_entity: str, partition_entity: str) -> tuple[tuple, ErrorCode]:
        """(topics, group error) of one group. `asked` None: every committed offset of
        topics the principal may read. Version 1 carries a group's refusal on every
        partition asked (it has no group error); later ones answer it alone."""
        wanted = None if asked is None else [(t.name, int(p)) for t in asked for p in t.partition_indexes]
        committed: dict[TopicPartition, int] = {}
        if refusal is None:
            try:
                if wanted is None:
                    committed = await self.coordinator.store.call(self.coordinator.store.committed_all, group_id)
                    wanted = sorted(k for k in committed if self.rules.reads(session, k[0]))
                else:
                    committed = await self.coordinator.store.call(self.coordinator.store.committed, group_id, wanted)
            except Exception as exc:
                logger.warning("group %s: reading offsets from ZooKeeper failed: %s", group_id, exc)
                refusal = ErrorCode.coordinator_not_available
        if refusal is not None and version >= 2:
            return (), refusal  # Kafka's answer: the group's error, no partitions
        wanted = wanted or []
        by_topic: dict[str, list[int]] = {}
        for topic, partition in wanted:
            by_topic.setdefault(topic, []).append(partition)

        def partition_error(topic: str) -> ErrorCode:
            if refusal is not None:
                return refusal
            return ErrorCode.none if self.rules.reads(session, topic) else ErrorCode.topic_authorization_failed

        topics = tuple(
            entity(ApiKey.OFFSET_FETCH, version, topic_entity, name=topic, partitions=tuple(
                entity(ApiKey.OFFSET_FETCH, version, partition_entity, partition_index=p,
                       committed_offset=committed.get((topic, p), NO_OFFSET) if partition_error(topic) == ErrorCode.none
                       else NO_OFFSET, committed_leader_epoch=-1, metadata="", error_code=partition_error(topic))
                for p in partitions))
            for topic, partitions in by_topic.items())
        return topics, refusal or ErrorCode.none


