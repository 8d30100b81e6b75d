"""One handler per API (docs/protocol.md); METADATA and CREATE_TOPIC, which read
only the cluster's view, are `topics.py`'s. Every handler decodes its request and
returns one shape: a `Reply`, the future of its response body (`protocol.Body`, encoded by
`broker.common.protocol`), already resolved unless the request must wait (acks=-1, long-poll
fetch, topic creation). A body of None means no response at all (acks=0).

Handlers raise `LogbusError`s; the connection turns them into error responses — or,
for an acks=0 request, into a log line only: such a request is never answered, not
even with an error, or a pipelining client would take that frame for the answer to
its next request (`broker.server.answers.Answers.refused`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from typing import Callable, Coroutine, NamedTuple

from broker.common.acls import Operation
from broker.common.errors import (
    BrokerShuttingDown, ErrorCode, IllegalSaslState, InvalidMessage, LogbusError, NotLeaderForPartition,
    UnknownPartition, UnknownTopic, UnsupportedApi,
)
from broker.common.message import BatchIdentity, batch_identity, validate_message_set
from broker.common.protocol import (
    FETCH_VERSION, METADATA_VERSION, ApiKey, Body, FetchRequest, FetchResponse, InitProducerIdRequest, LeaderEpochEndRequest,
    MultiFetchRequest, MultiProduceRequest, OffsetsRequest, PartitionResult, ProduceRequest, ProduceResponse,
    ProducerIdResponse, Reader, RecordCount, RecordCountRequest, ReplicaFetchRequest, RequestHeader, check_topic_name, encode_offsets, encode_results,
)
from broker.server.auth.authorizer import Authorizer
from broker.server.auth.rules import RequestRules
from broker.server.auth.sasl import Authentication
from broker.server.auth.session import Session
from broker.server.config import BrokerConfig
from broker.server.deferred import HOLD_SET_BYTES, DeferredAppends, HeldSets
from broker.server.log.log import AppendResult, Log
from broker.server.log.manager import LogManager
from broker.server.log.scheduler import FlushScheduler
from broker.server.producerids import ProducerIdAllocator
from broker.server.registration import BrokerRegistry
from broker.server.replication.manager import ReplicaManager
from broker.server.replication.partition import Partition
from broker.server.replies import Reply, answered, later
from broker.server.topics import TopicRequests

logger = logging.getLogger(__name__)

MAX_API_VERSIONS = {ApiKey.METADATA: METADATA_VERSION, ApiKey.FETCH: FETCH_VERSION,
                    ApiKey.MULTIFETCH: FETCH_VERSION}  # every other api: version 0 only
_HANDSHAKE = (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)
_VERSIONED = (ApiKey.METADATA, ApiKey.FETCH, ApiKey.MULTIFETCH)  # their handlers take the request's version
# Enum members as constants on a hot path (docs/architecture.md, "Enum members on hot paths").
_WRITE, _READ, _OK = Operation.WRITE, Operation.READ, ErrorCode.NONE


class Appended(NamedTuple):
    """One partition's append, as its acknowledgement needs it: where it ends, and for a
    replicated partition the leader epoch it was appended in (None: unreplicated). An
    acks=-1 answer is bound to that epoch (docs/replication.md). A tuple: one is built
    per append, on the produce path, by `_new_appended`."""

    log: Log
    base_offset: int
    next_offset: int
    epoch: int | None


_new_appended = functools.partial(tuple.__new__, Appended)  # in C: NamedTuple's own __new__ is Python


class RequestHandler:
    def __init__(self, config: BrokerConfig, logs: LogManager, scheduler: FlushScheduler, registry: BrokerRegistry,
                 replicas: ReplicaManager, producer_ids: ProducerIdAllocator | None = None,
                 authorizer: Authorizer | None = None) -> None:
        self.config = config
        self.rules = RequestRules(authorizer, lambda: registry.view.brokers)  # what each request needs
        self.producer_ids = producer_ids
        self.logs = logs
        self.scheduler = scheduler
        self.registry = registry
        self.replicas = replicas
        self.shutting_down = False
        self._unwritten: set[Log] = set()  # logs with buffered acks=0 appends
        self.deferred = DeferredAppends(self._append_held)  # acks=0 sets not yet appended
        self.authentication = Authentication(config, registry.zk)
        self.topics = TopicRequests(config, registry, logs, self.rules)
        self._handlers: dict[int, Callable[[Reader, Session], Reply]] = {
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self.fetch,
            ApiKey.MULTIFETCH: self.multifetch,
            ApiKey.MULTIPRODUCE: self.multiproduce,
            ApiKey.OFFSETS: self.offsets,
            ApiKey.RECORD_COUNT: self.record_count,
            ApiKey.METADATA: self.topics.metadata,
            ApiKey.CREATE_TOPIC: self.topics.create_topic, ApiKey.DELETE_TOPIC: self.topics.delete_topic,
            ApiKey.REPLICA_FETCH: self.replica_fetch,
            ApiKey.LEADER_EPOCH_END: self.leader_epoch_end,
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            ApiKey.SASL_HANDSHAKE: self.authentication.handshake,
            ApiKey.SASL_AUTHENTICATE: self.authentication.authenticate,
        }

    def handle(self, header: RequestHeader, reader: Reader, session: Session) -> Reply:
        handler = self._handlers.get(header.api_key)
        if handler is None or header.api_version > MAX_API_VERSIONS.get(header.api_key, 0) or header.api_version < 0:
            raise UnsupportedApi(f"api {header.api_key} version {header.api_version} is not supported")
        if not session.authenticated and header.api_key not in _HANDSHAKE:
            raise IllegalSaslState(f"listener {session.listener.name} authenticates: send SASL_HANDSHAKE and "
                                   "SASL_AUTHENTICATE before any other request")
        if self.shutting_down:
            raise BrokerShuttingDown(f"broker {self.config.broker_id} is shutting down")
        if header.api_key in _VERSIONED:
            return handler(reader, session, header.api_version)
        return handler(reader, session)

    @functools.cached_property
    def _no_reply(self) -> Reply:
        """The reply of every acks=0 request: one resolved future, not one per request."""
        return answered(None)

    # ----------------------------------------------------------------- partitions

    def leader_log(self, topic: str, partition: int) -> Log:
        """The local log of a partition this broker leads, or the error saying why not."""
        return self.led(topic, partition)[0]

    def led(self, topic: str, partition: int) -> tuple[Log, Partition | None]:
        """A partition this broker leads: its log, and its replication state when it is
        replicated (None: one replica); or the error saying why not."""
        assignment = self.registry.view.topics.get(topic)  # known topics have valid names
        if assignment is None:
            check_topic_name(topic)
            raise UnknownTopic(f"unknown topic {topic!r}")
        replicas = assignment.get(partition)
        if replicas is None:
            raise UnknownPartition(f"topic {topic!r} has partitions 0..{len(assignment) - 1}, not {partition}")
        if len(replicas) > 1:  # replicated: the leader is the state node's (broker.server.replication)
            led = self.replicas.leader_partition(topic, partition)
            return led.log, led
        if replicas[0] != self.config.broker_id:
            leader = self.registry.view.brokers.get(replicas[0])
            where = f"{leader.host}:{leader.port}" if leader else "a broker that is down"
            raise NotLeaderForPartition(f"partition {topic}-{partition} is led by broker {replicas[0]} ({where})")
        return self.logs.get_or_create(topic, partition), None

    def _pick_partition(self, topic: str) -> int:
        assignment = self.registry.view.topics.get(topic)
        if assignment is None:
            raise UnknownTopic(f"unknown topic {topic!r}")
        led = [p for p, r in assignment.items() if self._leader(topic, p, r) == self.config.broker_id]
        if not led:
            raise NotLeaderForPartition(f"broker {self.config.broker_id} leads no partition of topic {topic!r}")
        return random.choice(led)

    def _leader(self, topic: str, partition: int, replicas: list[int]) -> int:
        return self.replicas.leader_of(topic, partition, replicas) if len(replicas) > 1 else replicas[0]

    def _append(self, topic: str, partition: int, messages, acks: int) -> Appended | None:
        """Validate and append. An acknowledged append is in the page cache before its
        answer; a small plain acks=0 set is held and appended with the others of its
        socket read (None: held; `broker.server.deferred`), and acks=0 appends are
        written once per socket read (`write_unwritten`)."""
        log, led = self.led(topic, partition)
        if led is not None and acks == -1:
            self.replicas.check_insync(led)
        scanned = validate_message_set(messages, self.config.message_max_bytes, self.config.message_max_decompressed_bytes)
        batch = None
        if scanned.batches:
            if scanned.count > 1:
                raise InvalidMessage(f"a producer batch must be the only entry of its message set; this one has "
                                     f"{scanned.count} entries")
            batch = batch_identity(messages)
        elif acks == 0 and len(messages) <= HOLD_SET_BYTES:
            self.deferred.hold(log, topic, partition, messages, scanned)
            return None
        if self.deferred.held:  # in order after the held sets
            self.deferred.append_all()
        buffered = acks == 0
        result = log.append(messages, scanned.count, scanned.min_timestamp, scanned.max_timestamp, buffered, batch,
                            scanned.records, scanned.record_times)
        return self.appended(log, led, result, buffered, batch)

    def _append_held(self, log: Log, held: HeldSets) -> None:
        """A log's held acks=0 sets as one append — if this broker still leads its
        partition with that log (the safety-net turn may follow a leadership change)."""
        current, led = self.led(held.topic, held.partition)
        if current is not log:
            raise NotLeaderForPartition(f"{log.name} is no longer this broker's log of {held.topic}-{held.partition}")
        sets = held.sets
        result = log.append(sets[0] if len(sets) == 1 else b"".join(sets), held.count, held.low, held.high, True, None,
                            held.records, (held.record_low, held.record_high))
        self.appended(log, led, result, True, None)

    def appended(self, log: Log, led: Partition | None, result: AppendResult, buffered: bool,
                 batch: BatchIdentity | None) -> Appended:
        """After an append through either listener: the flush scheduler and the
        replicas told, buffered (acks=0) writes noted — none of it for a retry."""
        if result.duplicate:
            logger.debug("%s: producer %d's batch at sequence %d is a retry of offset %d", log.name,
                         batch.producer_id, batch.base_sequence, result.base_offset)
        else:
            if buffered:
                self._unwritten.add(log)
            self.scheduler.flusher(log).appended()
        if led is None:
            return _new_appended((log, result.base_offset, result.next_offset, None))
        led.appended()
        return _new_appended((log, result.base_offset, result.next_offset, led.epoch))

    def write_unwritten(self) -> None:
        """Called by connections after each socket read: the held sets appended, then
        one write per touched log."""
        if self.deferred.held:
            self.deferred.append_all()
        while self._unwritten:
            self._unwritten.pop().write_unwritten()

    # -------------------------------------------------------------------- produce

    def produce(self, reader: Reader, session: Session) -> Reply:
        req = ProduceRequest.decode(reader)
        self.rules.topic(session, _WRITE, req.topic)
        if req.topic not in self.registry.view.topics:
            self.rules.create(session, req.topic)
            return later(self._produce_after_create(req))
        return self._produce(req)

    async def _produce_after_create(self, req: ProduceRequest) -> Body | None:
        await self.topics.auto_create(req.topic)
        return await self._produce(req)

    def _produce(self, req: ProduceRequest) -> Reply:
        partition = self._pick_partition(req.topic) if req.partition == -1 else req.partition
        appended = self._append(req.topic, partition, req.messages, req.acks)
        if req.acks == 0:  # the hot path of acks=0 producers: nothing is built for an answer
            return self._no_reply
        body = [ProduceResponse(appended.base_offset, appended.next_offset).encode()]
        if req.acks == 1:
            return answered(body)
        return later(self._after_commit(body, appended, req.timeout_ms))

    async def _after_commit(self, body: Body, appended: Appended, timeout_ms: int) -> Body:
        await self.committed(appended, timeout_ms)
        return body

    def committed(self, appended: Appended, timeout_ms: int) -> Coroutine:
        """acks=-1: the fsync — for a replicated partition, the high watermark covering
        the append in the epoch it was made in: flushed on every in-sync replica."""
        if appended.epoch is None:
            return self.scheduler.flusher(appended.log).wait_flushed(appended.next_offset)
        return self.replicas.wait_committed(appended.log, appended.next_offset, appended.epoch, timeout_ms)

    def multiproduce(self, reader: Reader, session: Session) -> Reply:
        """Each partition answers on its own, refused or appended and — with acks=-1 —
        committed or not: one partition's failure never fails the others, so a producer
        retries only the batches that failed."""
        req = MultiProduceRequest.decode(reader)
        results: list[PartitionResult] = []
        appended: dict[int, Appended] = {}  # result index -> its append
        for part in req.parts:
            try:
                self.rules.topic(session, _WRITE, part.topic)
                partition = self._pick_partition(part.topic) if part.partition == -1 else part.partition
                done = self._append(part.topic, partition, part.messages, req.acks)
            except LogbusError as exc:
                logger.warning("multiproduce to %s-%d refused: %s", part.topic, part.partition, exc)
                results.append(PartitionResult.failed(exc))
            else:
                if done is not None:  # None: held, acks=0
                    appended[len(results)] = done
                    results.append(PartitionResult(_OK, ProduceResponse(done.base_offset, done.next_offset)))
        if req.acks == 0:
            return self._no_reply
        if req.acks == 1 or not appended:
            return answered(encode_results(results))
        return later(self._multiproduce_committed(results, appended, req.timeout_ms))

    async def _multiproduce_committed(self, results: list[PartitionResult], appended: dict[int, Appended],
                                      timeout_ms: int) -> Body:
        outcomes = await asyncio.gather(*(self.committed(a, timeout_ms) for a in appended.values()),
                                        return_exceptions=True)
        for (index, done), outcome in zip(appended.items(), outcomes):
            if isinstance(outcome, LogbusError):
                logger.warning("multiproduce to %s not committed: %s", done.log.name, outcome)
                results[index] = PartitionResult.failed(outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
        return encode_results(results)

    # ---------------------------------------------------------------------- fetch

    def fetch(self, reader: Reader, session: Session, version: int = 0) -> Reply:
        req = FetchRequest.decode(reader)
        self.rules.topic(session, _READ, req.topic)
        log = self.leader_log(req.topic, req.partition)
        answer = self._fetched(log, req, version)
        if len(answer.messages) >= req.min_bytes or req.max_wait_ms == 0:
            return answered(answer.encode_parts())
        return later(self._fetch_later(log, req, version))

    async def _fetch_later(self, log: Log, req: FetchRequest, version: int) -> Body:
        await self.scheduler.wait_for_data([(log, req.offset, req.min_bytes)], self._wait_seconds(req.max_wait_ms))
        return self._fetched(log, req, version).encode_parts()

    @staticmethod
    def _fetched(log: Log, req: FetchRequest, version: int) -> FetchResponse:
        """Version 1 answers the set covering a record's offset and says where it
        starts; version 0 reads at entry boundaries only (docs/protocol.md, FETCH)."""
        if version >= 1:
            set_offset, region = log.read_covering(req.offset, req.max_bytes)
            return FetchResponse(log.visible_offset, region, set_offset, version)
        return FetchResponse(log.visible_offset, log.read(req.offset, req.max_bytes), req.offset, version)

    def _wait_seconds(self, max_wait_ms: int) -> float:
        return min(max_wait_ms, self.config.fetch_max_wait_ms) / 1000

    def multifetch(self, reader: Reader, session: Session, version: int = 0) -> Reply:
        req = MultiFetchRequest.decode(reader)
        logs, results = self._multifetch_results(req, session, version)
        if not req.fetches or any(
            len(r.value.messages) >= f.min_bytes for r, f in zip(results, req.fetches) if r.error_code == _OK
        ):
            return answered(encode_results(results))
        return later(self._multifetch_later(req, session, logs, results, version))

    def _multifetch_results(self, req: MultiFetchRequest, session: Session,
                            version: int) -> tuple[list[Log | None], list[PartitionResult]]:
        """Each fetch's log (None when refused, by ACL too) and its result."""
        logs, results = [], []
        for f in req.fetches:
            try:
                self.rules.topic(session, _READ, f.topic)
                log = self.leader_log(f.topic, f.partition)
                answer = self._fetched(log, f, version)
            except LogbusError as exc:
                logs.append(None)
                results.append(PartitionResult.failed(exc))
            else:
                logs.append(log)
                results.append(PartitionResult(_OK, answer))
        return logs, results

    async def _multifetch_later(self, req: MultiFetchRequest, session: Session, logs: list[Log | None],
                                results, version: int) -> Body:
        waits = [(log, f.offset, f.min_bytes) for log, f in zip(logs, req.fetches) if log is not None]
        timeout = self._wait_seconds(max(f.max_wait_ms for f in req.fetches))
        if waits and timeout > 0:
            await self.scheduler.wait_for_data(waits, timeout)
            results = self._multifetch_results(req, session, version)[1]
        return encode_results(results)

    # ------------------------------------------------------------ offsets, producer ids

    def offsets(self, reader: Reader, session: Session) -> Reply:
        req = OffsetsRequest.decode(reader)
        self.rules.topic(session, Operation.DESCRIBE, req.topic)
        log = self.leader_log(req.topic, req.partition)
        return answered([encode_offsets(log.offsets_before(req.time, req.max_offsets))])

    def record_count(self, reader: Reader, session: Session) -> Reply:
        """Records between two offsets — lag in records (docs/protocol.md, RECORD_COUNT)."""
        req = RecordCountRequest.decode(reader)
        self.rules.topic(session, Operation.DESCRIBE, req.topic)
        log = self.leader_log(req.topic, req.partition)
        return answered([RecordCount(*log.record_count(req.start_offset, req.end_offset)).encode()])

    def init_producer_id(self, reader: Reader, session: Session) -> Reply:
        """A new idempotent producer's identity: an id no producer had, epoch 0."""
        InitProducerIdRequest.decode(reader)
        self.rules.producer_id(session)
        if self.producer_ids is None:
            raise UnsupportedApi("this broker hands out no producer ids")
        return later(self._producer_id())

    async def _producer_id(self) -> Body:
        producer_id = await asyncio.get_running_loop().run_in_executor(None, self.producer_ids.allocate)
        return [ProducerIdResponse(producer_id, 0).encode()]

    # ---------------------------------------------------------------- replication

    def replica_fetch(self, reader: Reader, session: Session) -> Reply:
        req = ReplicaFetchRequest.decode(reader)
        self.rules.replica(session, req.replica_id)
        return later(self.replicas.replica_fetch(req))

    def leader_epoch_end(self, reader: Reader, session: Session) -> Reply:
        req = LeaderEpochEndRequest.decode(reader)
        self.rules.replica(session, None)
        return answered(self.replicas.leader_epoch_end(req))
