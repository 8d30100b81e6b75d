"""The Kafka listener's requests (docs/kafka.md): one handler per API, each taking the
kio request of the version the client sent and returning a Reply — the future of a
kio response of that version (`messages.build` drops the fields a version lacks),
None for an acks=0 produce.

Metadata, offsets and producer ids live here, producing in `producing.py`, fetching
in `fetching.py`; they work on the same logs, replication,
flush scheduler and authorizer as the native handlers (`broker.server.handlers`, whose
partition lookup, append bookkeeping and acks=-1 wait they share). The group
coordinator's requests are `groups.py`'s, the administrative ones `admin.py`'s, SASL
`sasl.py`'s.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from kio.schema.errors import ErrorCode as KafkaError

from broker.common.acls import Operation
from broker.common.errors import IllegalSaslState, LogbusError, UnsupportedApi
from broker.common.kafka.apis import ApiKey
from broker.common.kafka.errors import kafka_error
from broker.common.kafka.frames import RequestHeader, api_versions_response
from broker.common.partitionstates import live_leader
from broker.server.auth.session import Session
from broker.server.handlers import RequestHandler
from broker.server.kafka.admin import AdminRequests
from broker.server.kafka.coordinator import GroupSettings
from broker.server.kafka.fetching import FetchRequests
from broker.server.kafka.groups import GroupRequests
from broker.server.kafka.producing import ProduceRequests
from broker.server.kafka.messages import NO_THROTTLE, entity, field, response
from broker.server.kafka.positions import kafka_end, offset_for_time
from broker.server.kafka.sasl import KafkaSasl
from broker.server.replies import Reply, answered, later

logger = logging.getLogger(__name__)

LATEST, EARLIEST = -1, -2  # ListOffsets' queries; -3 (max timestamp) is refused
CLUSTER_ID = "logbus"
KafkaHandler = Callable[[Any, int, Session], Reply]
_BEFORE_AUTH = (ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)


class KafkaRequests:
    """Dispatch by API key, and the data-path APIs."""

    def __init__(self, native: RequestHandler) -> None:
        self.native = native
        self.config = native.config
        self.rules = native.rules
        self.registry = native.registry
        self.fetching = FetchRequests(native)
        self.handlers: dict[int, KafkaHandler] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.PRODUCE: ProduceRequests(native).produce,
            ApiKey.FETCH: self.fetching.fetch,
            ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
        }
        self.add({**AdminRequests(native).handlers(),
                  **KafkaSasl(native.authentication, self.config.sasl_enabled_mechanisms).handlers()})
        # the group coordinator (groups.py): started and stopped with the broker
        self.groups = GroupRequests(self.registry.zk, self.config.broker_id, self.registry, self.rules,
                                    GroupSettings.from_config(self.config))
        self.add(self.groups.handlers())

    def add(self, handlers: dict[int, KafkaHandler]) -> None:
        """Handlers of other modules (groups, admin, SASL)."""
        self.handlers.update(handlers)

    def handle(self, header: RequestHeader, request: Any, session: Session) -> Reply:
        handler = self.handlers.get(header.api_key)
        if handler is None:
            raise UnsupportedApi(f"API {header.api_key} v{header.api_version} is not served")
        if not session.authenticated and header.api_key not in _BEFORE_AUTH:
            raise IllegalSaslState(f"listener {session.listener.name} authenticates: SaslHandshake and "
                                   "SaslAuthenticate come before any other request")
        return handler(request, header.api_version, session)

    # ------------------------------------------------------------------ metadata

    def api_versions(self, request: Any, version: int, session: Session) -> Reply:
        return answered(api_versions_response(version))

    def metadata(self, request: Any, version: int, session: Session) -> Reply:
        """Brokers at the addresses of the listener asked on; topics the principal may
        not describe are left out of a list of all and refused by name. An unknown
        topic asked for by name is created when the client allows it (v4+) and
        `auto.create.topics` is on, as Kafka does."""
        names = None if request.topics is None else [t.name for t in request.topics]
        if version == 0 and not names:
            names = None  # v0: an empty list means every topic
        missing = [n for n in names or () if n not in self.registry.view.topics and self.rules.describes(session, n)]
        if missing and self.config.auto_create_topics and field(request, "allow_auto_topic_creation", True):
            return later(self._metadata_after_create(request, version, session, names, missing))
        return answered(self._metadata(version, session, names))

    async def _metadata_after_create(self, request: Any, version: int, session: Session, names: list[str],
                                     missing: list[str]) -> Any:
        for name in missing:
            try:
                self.rules.create(session, name)
                await self.native.topics.auto_create(name)
            except LogbusError as exc:
                logger.info("metadata: %s not created: %s", name, exc)
        return self._metadata(version, session, names)

    def _metadata(self, version: int, session: Session, names: list[str] | None) -> Any:
        view = self.registry.view
        brokers = []
        for info in sorted(view.brokers.values(), key=lambda b: b.broker_id):
            endpoint = next((e for e in info.endpoints if e.name == session.listener.name), None)
            if endpoint is not None:
                brokers.append(entity(ApiKey.METADATA, version, "MetadataResponseBroker", node_id=info.broker_id,
                                      host=endpoint.host, port=endpoint.port, rack=None))
        topics = []
        for name in names if names is not None else sorted(view.topics):
            if not self.rules.describes(session, name):
                if names is not None:
                    topics.append(self._topic(version, name, KafkaError.topic_authorization_failed, ()))
                continue
            assignment = view.topics.get(name)
            if assignment is None:
                topics.append(self._topic(version, name, KafkaError.unknown_topic_or_partition, ()))
                continue
            partitions = []
            for partition, replicas in sorted(assignment.items()):
                state = self.registry.states.get(name, partition, replicas)
                leader = live_leader(state, view.brokers)
                partitions.append(entity(
                    ApiKey.METADATA, version, "MetadataResponsePartition",
                    error_code=KafkaError.none if leader >= 0 else KafkaError.leader_not_available,
                    partition_index=partition, leader_id=leader, leader_epoch=state.leader_epoch,
                    replica_nodes=tuple(replicas), isr_nodes=tuple(state.isr or replicas),
                    offline_replicas=tuple(r for r in replicas if r not in view.brokers)))
            topics.append(self._topic(version, name, KafkaError.none, tuple(partitions)))
        return response(ApiKey.METADATA, version, throttle_time=NO_THROTTLE, brokers=tuple(brokers),
                        cluster_id=CLUSTER_ID, controller_id=self.config.broker_id, topics=tuple(topics))

    @staticmethod
    def _topic(version: int, name: str, error: KafkaError, partitions: tuple) -> Any:
        return entity(ApiKey.METADATA, version, "MetadataResponseTopic", error_code=error, name=name, topic_id=None,
                      is_internal=False, partitions=partitions, topic_authorized_operations=-2147483648)

    # -------------------------------------------------------------- list offsets

    def list_offsets(self, request: Any, version: int, session: Session) -> Reply:
        """Earliest (-2), latest (-1: one past the last record) and by time; the max
        timestamp query (-3, KIP-734) is refused per partition."""
        topics = []
        for topic in request.topics:
            partitions = []
            refusal = self.rules.topic_refusal(session, Operation.DESCRIBE, topic.name)
            for part in topic.partitions:
                partitions.append(self._list_offset(version, topic.name, part, refusal))
            topics.append(entity(ApiKey.LIST_OFFSETS, version, "ListOffsetsTopicResponse", name=topic.name,
                                 partitions=tuple(partitions)))
        return answered(response(ApiKey.LIST_OFFSETS, version, throttle_time=NO_THROTTLE, topics=tuple(topics)))

    def _list_offset(self, version: int, topic: str, part: Any, refusal: Exception | None) -> Any:
        fields: dict[str, Any] = dict(timestamp=-1, offset=-1, leader_epoch=-1)
        try:
            if refusal is not None:
                raise refusal
            log, led = self.native.led(topic, part.partition_index)
            if led is not None:
                fields["leader_epoch"] = led.epoch
            if part.timestamp == LATEST:
                fields["offset"] = kafka_end(log)
            elif part.timestamp == EARLIEST:
                fields["offset"] = log.start_offset
            elif part.timestamp < 0:
                raise UnsupportedTimestampQuery(part.timestamp)
            else:
                found = offset_for_time(log, part.timestamp)
                if found is not None:
                    fields["offset"], fields["timestamp"] = found
            error = KafkaError.none
        except UnsupportedTimestampQuery:
            error = KafkaError.unsupported_version
        except LogbusError as exc:
            error = kafka_error(exc.code)
        return entity(ApiKey.LIST_OFFSETS, version, "ListOffsetsPartitionResponse",
                      partition_index=part.partition_index, error_code=error, old_style_offsets=(), **fields)

    # ---------------------------------------------------------------- producer ids

    def init_producer_id(self, request: Any, version: int, session: Session) -> Reply:
        """A new producer id (epoch 0) from the cluster's blocks, shared with the native
        producers; transactional ids are refused (logbus has no transactions)."""
        if request.transactional_id:
            return answered(response(ApiKey.INIT_PRODUCER_ID, version, throttle_time=NO_THROTTLE,
                                     error_code=KafkaError.transactional_id_authorization_failed,
                                     producer_id=-1, producer_epoch=-1))
        self.rules.producer_id(session)
        return later(self._producer_id(version))

    async def _producer_id(self, version: int) -> Any:
        loop = asyncio.get_running_loop()
        producer_id = await loop.run_in_executor(None, self.native.producer_ids.allocate)
        return response(ApiKey.INIT_PRODUCER_ID, version, throttle_time=NO_THROTTLE, error_code=KafkaError.none,
                        producer_id=producer_id, producer_epoch=0)


class UnsupportedTimestampQuery(Exception):
    """ListOffsets' -3 (max timestamp) and other negative queries Kafka added later."""
