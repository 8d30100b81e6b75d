"""Kafka's Produce on the Kafka listener (docs/kafka.md, "Produce"): each partition's one
record batch checked (`broker.common.kafka.records.check_batch`) and stored verbatim as
a magic-4 entry (`Log.append_kafka`), whose producer id, epoch and sequence are the
partition's producer state — so a retry, through either listener, is answered with the
first append's offsets. Each partition answers on its own: one refused batch never
fails the others. acks=0 gets no answer at all (not even an error), acks=1 once the
batch is in the leader's log, acks=-1 once committed (docs/replication.md)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kio.schema.errors import ErrorCode as KafkaError

from broker.common.acls import Operation
from broker.common.errors import LogbusError, UnsupportedApi
from broker.common.kafka.apis import ApiKey
from broker.common.kafka.errors import kafka_error
from broker.common.kafka.records import BatchRefused, check_batch
from broker.server.auth.session import Session
from broker.server.handlers import Appended, RequestHandler
from broker.server.kafka.messages import NO_THROTTLE, entity, field, response
from broker.server.replies import Reply, answered, later

logger = logging.getLogger(__name__)



class ProduceRequests:
    def __init__(self, native: RequestHandler) -> None:
        self.native = native
        self.config = native.config
        self.rules = native.rules

    def produce(self, request: Any, version: int, session: Session) -> Reply:
        """Each partition's one batch checked (`check_batch`) and stored verbatim
        (`Log.append_kafka`); each partition answers on its own. acks=0 gets no answer
        at all, acks=-1 waits for the commit (docs/replication.md)."""
        if field(request, "transactional_id"):
            raise UnsupportedApi("transactional produce is not supported (logbus has no transactions)")
        acks = request.acks
        answers: list[tuple[str, int, Any]] = []  # (topic, partition, Appended or a refusal)
        for topic in request.topic_data:
            refusal = self.rules.topic_refusal(session, Operation.WRITE, topic.name)
            for part in topic.partition_data:
                answers.append((topic.name, part.index, refusal or self._append(topic.name, part, acks)))
        if acks == 0:
            return answered(None)
        if acks == 1 or not any(isinstance(a, Appended) for _, _, a in answers):
            return answered(self._produce_response(version, answers))
        return later(self._produce_committed(version, answers, request.timeout.total_seconds() * 1000))

    def _append(self, topic: str, part: Any, acks: int) -> Appended | Exception:
        try:
            log, led = self.native.led(topic, part.index)
            if led is not None and acks == -1:
                self.native.replicas.check_insync(led)
            if part.records is None:
                raise BatchRefused("a produce request for a partition carries no records")
            produced = check_batch(part.records, self.config.message_max_bytes,
                                   self.config.message_max_decompressed_bytes)
            epoch = led.epoch if led is not None else 0
            result = log.append_kafka(part.records, produced, epoch, acks == 0)
            return self.native.appended(log, led, result, acks == 0, produced.identity)
        except (LogbusError, BatchRefused) as exc:
            logger.warning("Kafka produce to %s-%d refused: %s", topic, part.index, exc)
            return exc

    async def _produce_committed(self, version: int, answers: list, timeout_ms: float) -> Any:
        waits = [(i, a) for i, (_, _, a) in enumerate(answers) if isinstance(a, Appended)]
        outcomes = await asyncio.gather(*(self.native.committed(a, int(timeout_ms)) for _, a in waits),
                                        return_exceptions=True)
        for (i, _), outcome in zip(waits, outcomes):
            if isinstance(outcome, LogbusError):
                answers[i] = (answers[i][0], answers[i][1], outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
        return self._produce_response(version, answers)

    def _produce_response(self, version: int, answers: list) -> Any:
        by_topic: dict[str, list] = {}
        for topic, partition, outcome in answers:
            if isinstance(outcome, Appended):
                fields = dict(error_code=KafkaError.none, base_offset=outcome.base_offset,
                              log_start_offset=outcome.log.start_offset)
            elif isinstance(outcome, BatchRefused):
                fields = dict(error_code=refusal_code(outcome),
                              error_message=outcome.reason, base_offset=-1, log_start_offset=-1)
            else:
                fields = dict(error_code=kafka_error(outcome.code), error_message=str(outcome), base_offset=-1,
                              log_start_offset=-1)
            by_topic.setdefault(topic, []).append(entity(
                ApiKey.PRODUCE, version, "PartitionProduceResponse", index=partition, log_append_time=None,
                record_errors=(), **fields))
        topics = tuple(entity(ApiKey.PRODUCE, version, "TopicProduceResponse", name=t, partition_responses=tuple(p))
                       for t, p in by_topic.items())
        return response(ApiKey.PRODUCE, version, responses=topics, throttle_time=NO_THROTTLE)


def refusal_code(refused: BatchRefused) -> KafkaError:
    if refused.too_large:
        return KafkaError.message_too_large
    return KafkaError.corrupt_message if refused.corrupt else KafkaError.invalid_record
