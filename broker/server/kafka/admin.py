"""The Kafka listener's administrative requests (docs/kafka.md, "Administration"):
CreateTopics and DeleteTopics on the native CREATE_TOPIC's and DELETE_TOPIC's paths
and rules (`broker.server.topics`), and DescribeConfigs of the broker and of topics
(`configs.py`).

Each topic or resource is answered on its own: one refused topic of a CreateTopics
request does not stop the others, as in Kafka."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode as KafkaError

from broker.common.acls import ResourceType
from broker.common.errors import LogbusError
from broker.common.kafka.apis import ApiKey
from broker.common.kafka.errors import kafka_error
from broker.common.protocol import check_topic_name
from broker.server.auth.session import Session
from broker.server.handlers import RequestHandler
from broker.server.kafka.configs import ConfigValue, broker_configs, refused_topic_config, topic_configs
from broker.server.kafka.messages import NO_THROTTLE, entity, response
from broker.server.replies import Reply, answered, later
from broker.server.topics import MAX_PARTITIONS

logger = logging.getLogger(__name__)

DEFAULT = -1  # CreateTopics' num_partitions / replication_factor: the broker's default
TOPIC, BROKER = 2, 4  # DescribeConfigs' resource types (Kafka's ConfigResource.Type)


class Refused(Exception):
    """One topic or resource of a request refused, with Kafka's code and the reason."""

    def __init__(self, error: KafkaError, message: str) -> None:
        super().__init__(message)
        self.error = error


class NewTopic(NamedTuple):
    name: str
    partitions: int
    replication_factor: int
    configs: list[ConfigValue]


class AdminRequests:
    def __init__(self, native: RequestHandler) -> None:
        self.config = native.config
        self.rules = native.rules
        self.registry = native.registry
        self.logs = native.logs
        self.topics = native.topics

    def handlers(self) -> dict[int, Any]:
        return {ApiKey.CREATE_TOPICS: self.create_topics, ApiKey.DELETE_TOPICS: self.delete_topics,
                ApiKey.DESCRIBE_CONFIGS: self.describe_configs}

    # ------------------------------------------------------------- CreateTopics

    def create_topics(self, request: Any, version: int, session: Session) -> Reply:
        """Every topic checked first (authorization as CREATE_TOPIC: Create on the
        cluster or the topic), then the valid ones created unless `validate_only`."""
        names = [t.name for t in request.topics]
        checked: list[NewTopic | Refused] = []
        for topic in request.topics:
            try:
                if names.count(topic.name) > 1:
                    raise Refused(KafkaError.invalid_request, f"topic {topic.name!r} is named twice in one request")
                checked.append(self._check(topic, session))
            except Refused as refusal:
                checked.append(refusal)
            except LogbusError as exc:
                checked.append(Refused(kafka_error(exc.code), str(exc)))
        if request.validate_only or not any(isinstance(c, NewTopic) for c in checked):
            return answered(self._created(version, names, checked))
        return later(self._create(version, names, checked, request.timeout.total_seconds()))

    def _check(self, topic: Any, session: Session) -> NewTopic:
        self.rules.create(session, topic.name)
        check_topic_name(topic.name)
        if topic.name in self.registry.view.topics:
            raise Refused(KafkaError.topic_already_exists, f"topic {topic.name!r} already exists")
        if topic.assignments:
            raise Refused(KafkaError.invalid_request, "logbus assigns replicas itself: give num_partitions and "
                                                      "replication_factor, not replica assignments")
        partitions = self.config.num_partitions if topic.num_partitions == DEFAULT else topic.num_partitions
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise Refused(KafkaError.invalid_partitions, f"num_partitions must be 1..{MAX_PARTITIONS}, or -1 for "
                                                         f"the broker's num.partitions, not {topic.num_partitions}")
        factor = (self.config.default_replication_factor if topic.replication_factor == DEFAULT
                  else topic.replication_factor)
        live = len(self.registry.view.brokers)
        if not 1 <= factor <= live:
            raise Refused(KafkaError.invalid_replication_factor,
                          f"replication_factor {topic.replication_factor}: must be 1..{live} (the live brokers), "
                          "or -1 for the broker's default.replication.factor")
        configs = topic_configs(self.config, self.logs.config_for(topic.name))
        effective = {c.name: c.value for c in configs}
        for asked in topic.configs:
            reason = refused_topic_config(asked.name, asked.value, effective)
            if reason is not None:
                raise Refused(KafkaError.invalid_config, reason)
        return NewTopic(topic.name, partitions, factor, configs)

    async def _create(self, version: int, names: list[str], checked: list[NewTopic | Refused],
                      timeout_s: float) -> Any:
        """Create each topic in ZooKeeper (which is what makes it exist, as on the
        native path). A positive `timeout` bounds the wait: a topic not created by then
        is answered REQUEST_TIMED_OUT, and may still be created."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        done: list[NewTopic | Refused] = []
        for item in checked:
            if isinstance(item, NewTopic):
                creation = loop.run_in_executor(None, self.registry.create_topic, item.name, item.partitions,
                                                item.replication_factor)
                try:
                    if timeout_s > 0:
                        await asyncio.wait_for(asyncio.shield(creation), max(deadline - loop.time(), 0))
                    else:
                        await creation
                except asyncio.TimeoutError:
                    creation.add_done_callback(functools.partial(_created_late, item.name))
                    item = Refused(KafkaError.request_timed_out, f"topic {item.name!r} was not created within "
                                                                 f"{timeout_s * 1000:.0f} ms; it may still be")
                except LogbusError as exc:
                    item = Refused(kafka_error(exc.code), str(exc))
            done.append(item)
        return self._created(version, names, done)

    @staticmethod
    def _created(version: int, names: list[str], results: list[NewTopic | Refused]) -> Any:
        topics = []
        for name, result in zip(names, results):
            if isinstance(result, Refused):
                fields: dict[str, Any] = dict(error_code=result.error, error_message=str(result), num_partitions=-1,
                                              replication_factor=-1, configs=())
            else:
                fields = dict(error_code=KafkaError.none, error_message=None, num_partitions=result.partitions,
                              replication_factor=result.replication_factor, configs=tuple(
                                  entity(ApiKey.CREATE_TOPICS, version, "CreatableTopicConfigs", name=c.name,
                                         value=c.value, read_only=True, config_source=c.source, is_sensitive=False)
                                  for c in result.configs) if version >= 5 else ())
            topics.append(entity(ApiKey.CREATE_TOPICS, version, "CreatableTopicResult", name=name, topic_id=None,
                                 topic_config_error_code=0, **fields))
        return response(ApiKey.CREATE_TOPICS, version, throttle_time=NO_THROTTLE, topics=tuple(topics))

    # ------------------------------------------------------------- DeleteTopics

    def delete_topics(self, request: Any, version: int, session: Session) -> Reply:
        """Every topic checked as the native DELETE_TOPIC checks it (Delete on the topic,
        its existence, `delete.topic.enable`), then the valid ones deleted together,
        answered once each deletion is complete or the request's timeout has passed."""
        names = list(request.topic_names)
        checked: list[str | Refused] = []
        for name in names:
            try:
                if names.count(name) > 1:
                    raise Refused(KafkaError.invalid_request, f"topic {name!r} is named twice in one request")
                self.topics.check_deletion(session, name)
                checked.append(name)
            except Refused as refusal:
                checked.append(refusal)
            except LogbusError as exc:
                checked.append(Refused(kafka_error(exc.code), str(exc)))
        if not any(isinstance(c, str) for c in checked):
            return answered(self._deleted(version, names, checked))
        return later(self._delete(version, names, checked, request.timeout.total_seconds()))

    async def _delete(self, version: int, names: list[str], checked: list[str | Refused], timeout_s: float) -> Any:
        async def one(item: str | Refused) -> str | Refused:
            if isinstance(item, Refused):
                return item
            try:
                await self.topics.delete(item, timeout_s)
            except LogbusError as exc:
                return Refused(kafka_error(exc.code), str(exc))
            return item

        return self._deleted(version, names, list(await asyncio.gather(*(one(c) for c in checked))))

    @staticmethod
    def _deleted(version: int, names: list[str], results: list[str | Refused]) -> Any:
        topics = []
        for name, result in zip(names, results):
            refused = isinstance(result, Refused)
            topics.append(entity(ApiKey.DELETE_TOPICS, version, "DeletableTopicResult", name=name, topic_id=None,
                                 error_code=result.error if refused else KafkaError.none,
                                 error_message=str(result) if refused else None))
        return response(ApiKey.DELETE_TOPICS, version, throttle_time=NO_THROTTLE, responses=tuple(topics))

    # ---------------------------------------------------------- DescribeConfigs

    def describe_configs(self, request: Any, version: int, session: Session) -> Reply:
        results = []
        for resource in request.resources:
            try:
                configs = self._configs(resource.resource_type, resource.resource_name, session)
                keys = resource.configuration_keys
                entries = tuple(self._entry(version, c) for c in configs if keys is None or c.name in keys)
                error, message = KafkaError.none, None
            except Refused as refusal:
                entries, error, message = (), refusal.error, str(refusal)
            except LogbusError as exc:
                entries, error, message = (), kafka_error(exc.code), str(exc)
            results.append(entity(ApiKey.DESCRIBE_CONFIGS, version, "DescribeConfigsResult", error_code=error,
                                  error_message=message, resource_type=resource.resource_type,
                                  resource_name=resource.resource_name, configs=entries))
        return answered(response(ApiKey.DESCRIBE_CONFIGS, version, throttle_time=NO_THROTTLE,
                                 results=tuple(results)))

    def _configs(self, resource_type: int, name: str, session: Session) -> list[ConfigValue]:
        """DescribeConfigs on the topic, or on the cluster for the broker's settings."""
        if resource_type == TOPIC:
            self.rules.describe_configs(session, ResourceType.TOPIC, name)
            if name not in self.registry.view.topics:
                raise Refused(KafkaError.unknown_topic_or_partition, f"unknown topic {name!r}")
            return topic_configs(self.config, self.logs.config_for(name))
        if resource_type == BROKER:
            self.rules.describe_configs(session, ResourceType.CLUSTER, "")
            if name not in ("", str(self.config.broker_id)):
                raise Refused(KafkaError.invalid_request, f"this is broker {self.config.broker_id}, not {name!r}: "
                                                          "ask each broker for its own settings")
            return broker_configs(self.config)
        raise Refused(KafkaError.invalid_request, f"resource type {resource_type} is not described by logbus "
                                                  "(topics: 2, brokers: 4)")

    @staticmethod
    def _entry(version: int, value: ConfigValue) -> Any:
        return entity(ApiKey.DESCRIBE_CONFIGS, version, "DescribeConfigsResourceResult", name=value.name,
                      value=value.value, read_only=True, config_source=value.source, is_sensitive=False,
                      synonyms=(), config_type=value.type, documentation=None)


def _created_late(name: str, creation: asyncio.Future) -> None:
    """The end of a creation answered REQUEST_TIMED_OUT, logged (and its exception retrieved)."""
    if creation.cancelled() or creation.exception() is not None:
        logger.warning("topic %s, answered REQUEST_TIMED_OUT, was not created: %r", name,
                       None if creation.cancelled() else creation.exception())
    else:
        logger.info("topic %s, answered REQUEST_TIMED_OUT, was created after all", name)
