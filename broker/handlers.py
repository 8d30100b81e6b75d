"""One handler per API (DESIGN §4). A handler returns the response as parts — bytes,
or a `FileRegion` the connection sends with sendfile — or a coroutine producing them
when it must wait (acks=-1, long-poll fetch, topic creation), or None (acks=0).

Handlers raise `LogbusError`s; the connection turns them into error responses — or,
for an acks=0 request, into a log line only: such a request is never answered, not
even with an error, or a pipelining client would take that frame for the answer to
its next request (`server.Connection._refused`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Awaitable, Callable, Union

from broker.config import BrokerConfig
from broker.errors import (
    BrokerShuttingDown, ErrorCode, InvalidRequest, LogbusError, NotLeaderForPartition,
    TopicCreationDisabled, UnknownPartition, UnknownTopic, UnsupportedApi,
)
from broker.log.log import Log
from broker.log.manager import LogManager
from broker.log.scheduler import FlushScheduler
from broker.log.segment import FileRegion
from broker.message import validate_message_set
from broker.protocol import (
    AUTO_PARTITIONS, FETCH_RESPONSE_HEAD, ApiKey, CreateTopicRequest, FetchRequest, MetadataRequest, MetadataResponse,
    MultiFetchRequest, MultiProduceRequest, OffsetsRequest, PartitionMetadata, ProduceRequest, ProduceResponse,
    Reader, RequestHeader, TopicMetadata, Writer, check_topic_name, encode_offsets, response_header,
)
from broker.registry import BrokerRegistry

logger = logging.getLogger(__name__)

Part = Union[bytes, FileRegion]
Result = Union[list[Part], Awaitable[list[Part]], None]
MAX_PARTITIONS = 10_000


def ok(correlation_id: int, body: bytes) -> list[Part]:
    return [response_header(correlation_id, 0, len(body)) + body]


class RequestHandler:
    def __init__(self, config: BrokerConfig, logs: LogManager, scheduler: FlushScheduler, registry: BrokerRegistry) -> None:
        self.config = config
        self.logs = logs
        self.scheduler = scheduler
        self.registry = registry
        self.shutting_down = False
        self._unwritten: set[Log] = set()  # logs with buffered acks=0 appends
        self._handlers: dict[int, Callable[[RequestHeader, Reader], Result]] = {
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self.fetch,
            ApiKey.MULTIFETCH: self.multifetch,
            ApiKey.MULTIPRODUCE: self.multiproduce,
            ApiKey.OFFSETS: self.offsets,
            ApiKey.METADATA: self.metadata,
            ApiKey.CREATE_TOPIC: self.create_topic,
        }

    def handle(self, header: RequestHeader, reader: Reader) -> Result:
        handler = self._handlers.get(header.api_key)
        if handler is None or header.api_version != 0:
            raise UnsupportedApi(f"api {header.api_key} version {header.api_version} is not supported")
        if self.shutting_down:
            raise BrokerShuttingDown(f"broker {self.config.broker_id} is shutting down")
        return handler(header, reader)

    # ----------------------------------------------------------------- partitions

    def leader_log(self, topic: str, partition: int) -> Log:
        """The local log of a partition this broker leads, or the error saying why not."""
        assignment = self.registry.view.topics.get(topic)  # known topics have valid names
        if assignment is None:
            check_topic_name(topic)
            raise UnknownTopic(f"unknown topic {topic!r}")
        replicas = assignment.get(partition)
        if replicas is None:
            raise UnknownPartition(f"topic {topic!r} has partitions 0..{len(assignment) - 1}, not {partition}")
        if replicas[0] != self.config.broker_id:
            leader = self.registry.view.brokers.get(replicas[0])
            where = f"{leader.host}:{leader.port}" if leader else "a broker that is down"
            raise NotLeaderForPartition(f"partition {topic}-{partition} is led by broker {replicas[0]} ({where})")
        return self.logs.get_or_create(topic, partition)

    def _pick_partition(self, topic: str) -> int:
        assignment = self.registry.view.topics.get(topic)
        if assignment is None:
            raise UnknownTopic(f"unknown topic {topic!r}")
        led = [p for p, r in assignment.items() if r[0] == self.config.broker_id]
        if not led:
            raise NotLeaderForPartition(f"broker {self.config.broker_id} leads no partition of topic {topic!r}")
        return random.choice(led)

    async def _auto_create(self, topic: str) -> None:
        check_topic_name(topic)
        if not self.config.auto_create_topics:
            raise TopicCreationDisabled(f"unknown topic {topic!r} (auto.create.topics is off)")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.registry.ensure_topic, topic, self.config.num_partitions)

    def _append(self, topic: str, partition: int, messages, acks: int) -> tuple[Log, int, int]:
        """Validate and append. An acknowledged append is in the page cache before its
        answer; acks=0 appends are written once per socket read (`write_unwritten`)."""
        log = self.leader_log(topic, partition)
        scanned = validate_message_set(messages, self.config.message_max_bytes, self.config.message_max_decompressed_bytes)
        buffered = acks == 0
        result = log.append(messages, scanned.count, scanned.min_timestamp, scanned.max_timestamp, buffered)
        if buffered:
            self._unwritten.add(log)
        self.scheduler.flusher(log).appended()
        return log, result.base_offset, result.next_offset

    def write_unwritten(self) -> None:
        """Called by connections after each socket read: one write per touched log."""
        while self._unwritten:
            self._unwritten.pop().write_unwritten()

    # -------------------------------------------------------------------- produce

    def produce(self, header: RequestHeader, reader: Reader) -> Result:
        req = ProduceRequest.decode(reader)
        if req.topic not in self.registry.view.topics:
            return self._produce_after_create(header, req)
        return self._produce(header, req)

    async def _produce_after_create(self, header: RequestHeader, req: ProduceRequest) -> list[Part] | None:
        await self._auto_create(req.topic)
        result = self._produce(header, req)
        return await result if asyncio.iscoroutine(result) else result

    def _produce(self, header: RequestHeader, req: ProduceRequest) -> Result:
        partition = self._pick_partition(req.topic) if req.partition == -1 else req.partition
        log, base, next_offset = self._append(req.topic, partition, req.messages, req.acks)
        if req.acks == 0:
            return None
        body = ProduceResponse(base, next_offset).encode()
        if req.acks == 1:
            return ok(header.correlation_id, body)
        return self._after_flush(header.correlation_id, body, [(log, next_offset)])

    async def _after_flush(self, correlation_id: int, body: bytes, waits: list[tuple[Log, int]]) -> list[Part]:
        await asyncio.gather(*(self.scheduler.flusher(log).wait_flushed(offset) for log, offset in waits))
        return ok(correlation_id, body)

    def multiproduce(self, header: RequestHeader, reader: Reader) -> Result:
        req = MultiProduceRequest.decode(reader)
        w = Writer().int16(len(req.parts))
        waits = []
        for part in req.parts:
            try:
                partition = self._pick_partition(part.topic) if part.partition == -1 else part.partition
                log, base, next_offset = self._append(part.topic, partition, part.messages, req.acks)
            except LogbusError as exc:
                logger.warning("multiproduce to %s-%d refused: %s", part.topic, part.partition, exc)
                w.int16(exc.code).string(str(exc))
            else:
                w.int16(0).int64(base).int64(next_offset)
                waits.append((log, next_offset))
        if req.acks == 0:
            return None
        if req.acks == 1:
            return ok(header.correlation_id, bytes(w.buf))
        return self._after_flush(header.correlation_id, bytes(w.buf), waits)

    # ---------------------------------------------------------------------- fetch

    def fetch(self, header: RequestHeader, reader: Reader) -> Result:
        req = FetchRequest.decode(reader)
        log = self.leader_log(req.topic, req.partition)
        region = log.read(req.offset, req.max_bytes)
        if region.length >= req.min_bytes or req.max_wait_ms == 0:
            return self._fetch_response(header.correlation_id, log, region)
        return self._fetch_later(header.correlation_id, log, req)

    async def _fetch_later(self, correlation_id: int, log: Log, req: FetchRequest) -> list[Part]:
        await self.scheduler.wait_for_data([(log, req.offset, req.min_bytes)], self._wait_seconds(req.max_wait_ms))
        return self._fetch_response(correlation_id, log, log.read(req.offset, req.max_bytes))

    def _wait_seconds(self, max_wait_ms: int) -> float:
        return min(max_wait_ms, self.config.fetch_max_wait_ms) / 1000

    @staticmethod
    def _fetch_response(correlation_id: int, log: Log, region: FileRegion) -> list[Part]:
        head = FETCH_RESPONSE_HEAD.pack(log.flushed_offset, region.length)
        return [response_header(correlation_id, 0, len(head) + region.length) + head, region]

    def multifetch(self, header: RequestHeader, reader: Reader) -> Result:
        req = MultiFetchRequest.decode(reader)
        parts = self._multifetch_parts(req)
        if not req.fetches or any(p[1] >= f.min_bytes for p, f in zip(parts, req.fetches) if p[0] is not None):
            return self._multifetch_response(header.correlation_id, req, parts)
        return self._multifetch_later(header, req, parts)

    def _multifetch_parts(self, req: MultiFetchRequest) -> list[tuple[Log | None, int, list[Part]]]:
        parts = []
        for f in req.fetches:
            try:
                log = self.leader_log(f.topic, f.partition)
                region = log.read(f.offset, f.max_bytes)
            except LogbusError as exc:
                body = Writer().int16(exc.code).string(str(exc)).buf
                parts.append((None, 0, [bytes(body)]))
                continue
            head = Writer().int16(0).raw(FETCH_RESPONSE_HEAD.pack(log.flushed_offset, region.length)).buf
            parts.append((log, region.length, [bytes(head), region]))
        return parts

    async def _multifetch_later(self, header: RequestHeader, req: MultiFetchRequest, parts) -> list[Part]:
        waits = [(log, f.offset, f.min_bytes) for (log, _, _), f in zip(parts, req.fetches) if log is not None]
        timeout = self._wait_seconds(max(f.max_wait_ms for f in req.fetches))
        if waits and timeout > 0:
            await self.scheduler.wait_for_data(waits, timeout)
            parts = self._multifetch_parts(req)
        return self._multifetch_response(header.correlation_id, req, parts)

    @staticmethod
    def _multifetch_response(correlation_id: int, req: MultiFetchRequest, parts) -> list[Part]:
        body: list[Part] = [len(req.fetches).to_bytes(2, "big", signed=True)]
        for _, _, entry in parts:
            body += entry
        size = sum(p.length if isinstance(p, FileRegion) else len(p) for p in body)
        return [response_header(correlation_id, 0, size), *body]

    # ------------------------------------------------------------ offsets, metadata

    def offsets(self, header: RequestHeader, reader: Reader) -> Result:
        req = OffsetsRequest.decode(reader)
        log = self.leader_log(req.topic, req.partition)
        return ok(header.correlation_id, encode_offsets(log.offsets_before(req.time, req.max_offsets)))

    def metadata(self, header: RequestHeader, reader: Reader) -> Result:
        req = MetadataRequest.decode(reader)
        view = self.registry.view
        topics = []
        for topic in req.topics or sorted(view.topics):
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
                leader = replicas[0] if replicas[0] in view.brokers else -1
                log = self.logs.get(topic, partition) if leader == self.config.broker_id else None
                earliest, latest = (log.start_offset, log.flushed_offset) if log else (-1, -1)
                partitions.append(PartitionMetadata(partition, leader, replicas, earliest, latest))
            topics.append(TopicMetadata(topic, 0, partitions))
        body = MetadataResponse(sorted(view.brokers.values(), key=lambda b: b.broker_id), topics).encode()
        return ok(header.correlation_id, body)

    def create_topic(self, header: RequestHeader, reader: Reader) -> Result:
        req = CreateTopicRequest.decode(reader)
        check_topic_name(req.topic)
        if req.partitions == AUTO_PARTITIONS:
            return self._auto_create_topic(header.correlation_id, req.topic)
        if not 1 <= req.partitions <= MAX_PARTITIONS:
            raise InvalidRequest(
                f"partitions must be 1..{MAX_PARTITIONS}, or {AUTO_PARTITIONS} for the broker's num.partitions, "
                f"not {req.partitions}"
            )
        if req.replication_factor != 1:
            raise InvalidRequest(f"replication factor {req.replication_factor} is not supported yet (only 1)")
        return self._create_topic(header.correlation_id, req)

    async def _auto_create_topic(self, correlation_id: int, topic: str) -> list[Part]:
        """Clients that learn a topic is missing ask for it to be created exactly as a
        first produce would: num.partitions, only if auto.create.topics is on, and an
        existing topic is success."""
        if topic not in self.registry.view.topics:
            await self._auto_create(topic)
        return ok(correlation_id, b"")

    async def _create_topic(self, correlation_id: int, req: CreateTopicRequest) -> list[Part]:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.registry.create_topic, req.topic, req.partitions)
        return ok(correlation_id, b"")
