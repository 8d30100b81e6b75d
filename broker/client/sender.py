"""The producer's sender: the one thread that talks to brokers (kafka-python's Sender
is the model).

Each round it creates or finds topics callers are waiting for, publishes monitoring
events when due, drains the ready batches from the accumulator, encodes each once,
writes them through the `Pipeline` and settles each outcome:

- delivered: counted (report, monitoring counts, `on_delivery`), its future resolved;
- a retriable error — by its class, which the wire error code names: leader moved,
  broker down or shutting down, connection lost, storage error, topic not yet
  visible — refreshes the topic's metadata and puts the batch back after
  `retry_backoff`, up to `retries` times and while it is younger than
  `delivery_timeout`;
- any other error (TopicCreationDisabled, MessageTooLarge, InvalidMessage, ...) or
  the last attempt: failed, its future resolved with the error.

A batch that waited longer than `delivery_timeout` (no live leader) fails too.

With idempotence (`ProducerIdentity`, idempotence.py) the sender first asks a broker for
a producer id, sends each batch as one producer batch (magic 3) with its sequence, at
most five batches of a partition per round, and treats OutOfOrderSequence as retriable
while an earlier batch of the partition in the same round did not succeed (it is being
retried first); with nothing earlier outstanding, the partition lost the producer's
earlier batches, so its epoch is bumped and the batch retried.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from broker.client.accumulator import RecordAccumulator
from broker.client.batch import ProducerBatch
from broker.client.cluster import LEADER_MOVED, ConnectionPool, ensure_topic
from broker.client.metadata import ClusterMetadata, Leaders
from broker.client.errors import PartitionUnavailable
from broker.client.idempotence import ProducerIdentity
from broker.client.monitoring import MonitoringCounter
from broker.client.partitioner import partition_for_key
from broker.client.pipeline import Outcome, Outgoing, Pipeline, new_outgoing
from broker.client.results import DeliveredBatch, FailedSend, ReportBook, delivered_batch
from broker.common.errors import (
    BrokerShuttingDown, DuplicateSequence, LogbusError, NotEnoughReplicas, NotEnoughReplicasAfterAppend, OutOfOrderSequence,
    RequestTimedOut, StorageError, TopicCreationDisabled, UnknownPartition, UnknownTopic,
)
from broker.common.compression import Codec
from broker.common.protocol import Acks
from broker.common.message import HEADER_SIZE, encode_batch, encode_message_set, now_ms

logger = logging.getLogger(__name__)
_PLAIN, _NO_ACKS = Codec.NONE, Acks.NONE  # named once a batch (docs/architecture.md, "Enum members on hot paths")

# Errors that may go away: the leader moved or restarted (or is being elected), the
# disk got space back, a just-created topic is not yet known to the broker that leads
# it, the ISR is too small for acks=-1 right now or did not replicate in time. The last
# two (NotEnoughReplicasAfterAppend, RequestTimedOut) were appended on the leader: without
# idempotence a retry may duplicate them (at-least-once, as after a lost connection).
RETRIABLE = (ConnectionError, OSError, BrokerShuttingDown, StorageError, UnknownTopic, PartitionUnavailable,
             NotEnoughReplicas, NotEnoughReplicasAfterAppend, RequestTimedOut, *LEADER_MOVED)


def retriable(error: BaseException, batch: ProducerBatch) -> bool:
    if isinstance(error, TopicCreationDisabled):
        return False
    if isinstance(error, UnknownPartition):
        return batch.movable  # another partition may do; a placed message has no other
    return isinstance(error, RETRIABLE)


def _call_back(callback: Callable, argument: object) -> None:
    """A user's callback that raises is logged; the other batches' callbacks still run."""
    try:
        callback(argument)
    except Exception:
        logger.exception("producer callback %r raised", callback)


def _unencoded(drained: list[tuple[ProducerBatch, int]]) -> list[Outgoing]:
    """A round's batches for the pipeline to encode as it writes them."""
    return [new_outgoing((batch, batch.topic, batch.partition, leader, None)) for batch, leader in drained]


class Sender:
    """The sender thread and what it owns: the connection pool, the in-flight
    requests (through the `Pipeline`) and retries."""

    def __init__(self, accumulator: RecordAccumulator, metadata: ClusterMetadata, pool: ConnectionPool,
                 pipeline: Pipeline, codec: Codec, report: ReportBook, *, retries: int, retry_backoff: float,
                 delivery_timeout: float, monitoring: MonitoringCounter | None = None,
                 on_delivery: Callable[[DeliveredBatch], None] | None = None,
                 on_error: Callable[[list[FailedSend]], None] | None = None, name: str = "logbus-sender",
                 idempotence: ProducerIdentity | None = None) -> None:
        self.accumulator = accumulator
        self.idempotence = idempotence
        self._producer_id_retry_at = 0.0
        self.metadata = metadata
        self.pool = pool
        self.pipeline = pipeline
        self.codec = codec
        self.report = report
        self.retries = retries
        self.retry_backoff = retry_backoff
        self.delivery_timeout = delivery_timeout
        self.monitoring = monitoring
        self.on_delivery = on_delivery
        self.on_error = on_error
        self.publish_requested = False  # set by flush/close; cleared once events are queued
        self._stop_at = float("inf")
        self._closing = False
        # Topics callers wait for (`topic_partitions`), guarded by `_topics`.
        self._topics = threading.Condition()
        self._wanted: set[str] = set()
        self._topic_errors: dict[str, BaseException] = {}
        self._topic_retry_at: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # ------------------------------------------------------------ from other threads

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def request_publish(self) -> None:
        self.publish_requested = True
        self.accumulator.wake()

    def stop(self, deadline: float) -> None:
        """Finish what is outstanding, then stop; stop anyway at `deadline`."""
        self._closing = True
        self._stop_at = deadline
        self.request_publish()

    def join(self, timeout: float) -> None:
        self._thread.join(max(0.0, timeout))

    def topic_partitions(self, topic: str, deadline: float) -> int:
        """The partition count of `topic`, once the sender has found or created it.
        Raises TopicCreationDisabled at once, PartitionUnavailable at `deadline`."""
        with self._topics:
            self._topic_errors.pop(topic, None)
            self._wanted.add(topic)
        self.accumulator.wake()
        while True:
            leaders = self.metadata.partitions(topic)
            if leaders:
                return len(leaders)
            with self._topics:
                error = self._topic_errors.get(topic)
                if error is not None:
                    raise error
                left = deadline - time.monotonic()
                if left <= 0 or not self.alive():
                    raise PartitionUnavailable(f"topic {topic!r} is unknown and could not be created in time")
                self._topics.wait(min(left, 0.1))

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        accumulator = self.accumulator
        while True:
            now = time.monotonic()
            if now >= self._stop_at:
                return  # close() fails what is left
            if self._wanted:
                self._find_topics(now)
            if self.publish_requested or (self.monitoring is not None and self.monitoring.due()):
                self._publish_monitoring()
            if self.idempotence is not None and self.idempotence.producer_id is None:
                ready = self._init_producer_id(now)
            else:
                ready = True
            drained = accumulator.drain(now, self._leaders) if ready else []
            for batch in accumulator.expire(now, self.delivery_timeout, self._topic_errors):
                self.fail(batch, self._topic_errors.get(batch.topic) or PartitionUnavailable(
                    f"not delivered within {self.delivery_timeout:g}s: no live leader for the partition, "
                    "or every attempt failed"))
            if drained or self.pipeline.unanswered:
                try:
                    if drained:
                        self._send(drained)
                    else:  # no next round to encode meanwhile: the last one's answers now
                        self._settle(self.pipeline.answers())
                except Exception as exc:  # a bug must not silently stop delivery: fail the round, go on
                    logger.exception("producer sender round failed")
                    for batch, _ in drained:
                        self.fail(batch, exc)
                continue
            if self._closing and not accumulator.outstanding and not self.publish_requested:
                if self.monitoring is None or not self.monitoring.pending():
                    return
                self.publish_requested = True  # messages delivered after the last publish
                continue
            longest = min(self.retry_backoff if self._wanted else 1.0, self._stop_at - now)
            accumulator.wait_for_work(now, longest)

    def _leaders(self, topic: str) -> Leaders | None:
        """A batch's topic's leaders. A deleted topic is looked for again (`_find_topics`):
        created anew if brokers auto-create, else its batches fail at once with the
        refusal rather than wait for a leader until the delivery timeout."""
        if (leaders := self.metadata.partitions(topic)) is None and topic not in self._topic_errors:
            with self._topics:
                self._wanted.add(topic)
        elif leaders is not None:
            self._topic_errors.pop(topic, None)  # it exists (again)
        return leaders

    def _answered_first(self) -> None:
        """Settle the last round's unread answers before a request of the sender's own
        (a topic's creation, a producer id) on a pooled connection: a connection's
        answers come in order, and that request would take a produce answer for its own."""
        if self.pipeline.unanswered:
            self._settle(self.pipeline.answers())

    def _find_topics(self, now: float) -> None:
        with self._topics:
            wanted = [t for t in self._wanted if self._topic_retry_at.get(t, 0.0) <= now]
        if wanted:
            self._answered_first()
        for topic in wanted:
            error = None
            try:
                ensure_topic(self.metadata, self.pool, topic)
            except TopicCreationDisabled as exc:
                error = exc
            except (ConnectionError, OSError, LogbusError) as exc:
                logger.info("cannot create or find topic %s yet: %s", topic, exc)
                self._topic_retry_at[topic] = now + self.retry_backoff
                continue
            with self._topics:
                self._wanted.discard(topic)
                if error is not None:
                    self._topic_errors[topic] = error
                self._topics.notify_all()

    def _init_producer_id(self, now: float) -> bool:
        """Ask a live broker for a producer id (INIT_PRODUCER_ID); False while none
        answers, so nothing is sent without one (batches wait, then expire)."""
        if now < self._producer_id_retry_at:
            return False
        conn = None
        try:
            self._answered_first()
            conn = self.pool.any()
            producer_id = conn.init_producer_id().producer_id
        except (ConnectionError, OSError, LogbusError) as exc:
            if conn is not None and not isinstance(exc, LogbusError):
                self.pool.drop_connection(conn)
            logger.info("no producer id yet: %s", exc)
            self._producer_id_retry_at = now + max(self.retry_backoff, 0.05)
            return False
        self.idempotence.start(producer_id)
        logger.info("idempotent producer id %d", producer_id)
        return True

    def _publish_monitoring(self) -> None:
        """Queue monitoring events for the windows whose counts changed."""
        events = self.monitoring.events() if self.monitoring is not None else []
        if events:
            topic = self.monitoring.monitoring_topic
            try:
                self._answered_first()
                count = len(ensure_topic(self.metadata, self.pool, topic))
            except (ConnectionError, OSError, LogbusError) as exc:
                logger.warning("could not publish %d monitoring events: %s", len(events), exc)
            else:
                ts = now_ms()
                self.accumulator.append_internal(
                    topic, [(partition_for_key(key, count), (key, value, ts)) for key, value in events])
        self.accumulator.notify_idle_waiters(lambda: setattr(self, "publish_requested", False))

    def _encode(self, batch: ProducerBatch) -> bytes:
        if self.idempotence is None:  # a set compressed below its message count goes plain (docs/clients.md)
            payload = encode_message_set(batch.messages(), self.codec)
            if self.codec is not _PLAIN and payload[5] == 0:  # plain entries: each future its own offset
                batch.exact = True
                if batch.result is not None:
                    batch.result.exact = True
            return payload
        return encode_batch(batch.messages(), self.idempotence.assign(batch), self.codec)

    def _send(self, drained: list[tuple[ProducerBatch, int]]) -> None:
        """Write a round, each batch encoded as its request is written (pipeline.py), and
        settle it. The idempotent producer with acks reads a round's answers only after
        it has drained and encoded the next (BENCHMARKS.md, issue 38): the broker appends
        one round while this thread encodes the next. Sequences make that safe: a batch
        whose partition's earlier batch failed is held back behind its retry."""
        if self.idempotence is None or self.pipeline.acks == _NO_ACKS:
            self._settle(self.pipeline.send(_unencoded(drained), self._encode))
        elif not self.pipeline.unanswered:  # no round of the broker's to overlap with: encoded as written
            self.pipeline.write(_unencoded(drained), self._encode)
        else:
            following = [new_outgoing((batch, batch.topic, batch.partition, leader, self._encode(batch)))
                         for batch, leader in drained]
            self.pipeline.write(self._settle(self.pipeline.answers(), following))

    def _settle(self, outcomes: list[Outcome], following: list[Outgoing] = ()) -> list[Outgoing]:
        """Deliver, retry or fail a round's batches by their outcomes. `following`, the
        next round (encoded, not written): its batches of a partition with a batch that
        did not succeed go back behind the retries; the others are returned to write."""
        now = time.monotonic()
        delivered: list[tuple[ProducerBatch, int]] = []
        again: list[ProducerBatch] = []
        refreshed: set[str] = set()
        unsettled: set[tuple[str, int]] = set()  # partitions with a batch that did not succeed this round
        for batch, base_offset, error in outcomes:
            if error is None or isinstance(error, DuplicateSequence):  # the latter: appended before, offset unknown
                delivered.append((batch, base_offset))
                continue
            key = (batch.topic, batch.partition)
            if isinstance(error, OutOfOrderSequence) and self.idempotence is not None:
                if key not in unsettled:  # nothing earlier is being retried: the partition lost our batches
                    self.idempotence.reset(*key)
                retry = batch.attempts < self.retries and now - batch.created < self.delivery_timeout
            else:
                retry = (retriable(error, batch) and batch.attempts < self.retries
                         and now - batch.created < self.delivery_timeout)
            unsettled.add(key)
            logger.info("produce to %s-%d failed (%s: %s)%s", batch.topic, batch.partition, type(error).__name__,
                        error, "; retrying" if retry else "")
            if not retry:
                self.fail(batch, error)
                continue
            if batch.topic not in refreshed:
                refreshed.add(batch.topic)
                self.metadata.refresh(batch.topic)
            again.append(batch)
        held = [out.batch for out in following if (out.topic, out.partition) in unsettled] if unsettled else []
        if delivered:
            self._deliver(delivered)
        if again or held:
            self.accumulator.retry(again, now, held)
        return [out for out in following if (out.topic, out.partition) not in unsettled] if held else following

    # ------------------------------------------------------------------ outcomes

    def _deliver(self, delivered: list[tuple[ProducerBatch, int]]) -> None:
        """Count, resolve and call back a round's delivered batches, then release them
        (one lock each for the round: per-batch locking made callers queue behind this
        thread). Release comes last, as in Kafka's sender: a flush that sees nothing
        outstanding must see every count, future and `on_delivery` call done."""
        mine = self.accumulator.claim([batch for batch, _ in delivered])
        if len(mine) < len(delivered):
            settled = set(mine)
            delivered = [(b, offset) for b, offset in delivered if b in settled]
        user = [(b, offset) for b, offset in delivered if not b.internal]
        if self.monitoring is not None:
            for batch, _ in user:
                timestamps = batch.timestamps()
                self.monitoring.record_batch(batch.topic, timestamps, batch.bytes - HEADER_SIZE * len(timestamps),
                                             batch.messages)
        self.report.delivered(sum(len(b.fields) for b, _ in user) // 3)  # `count`, without a call a batch
        try:
            for batch, base_offset in delivered:
                if batch.result is not None:
                    batch.result.succeed(batch.partition, base_offset)
                for rider in batch.riders:
                    rider.succeed(batch.partition, base_offset)
            if self.on_delivery is not None:
                for batch, base_offset in user:
                    count = batch.count
                    _call_back(self.on_delivery, delivered_batch((batch.topic, batch.partition, base_offset, count,
                                                                  batch.bytes - HEADER_SIZE * count, batch.created)))
        finally:
            self.accumulator.release(mine)

    def fail(self, batch: ProducerBatch, error: BaseException) -> None:
        """Give up on a batch (thread-safe: close() fails what the sender still holds).
        A failed batch that was sent leaves a gap in its partition's sequences, so with
        idempotence the partition starts a new epoch."""
        if not self.accumulator.claim([batch]):
            return
        if self.idempotence is not None and batch.sequence is not None:
            self.idempotence.reset(batch.topic, batch.partition)
        failures = []
        if batch.internal:
            logger.warning("could not publish %d monitoring events: %s", batch.count, error)
        else:
            failures = [FailedSend(batch.topic, key, value, ts, batch.partition, error)
                        for key, value, ts in batch.messages()]
            self.report.failed(failures)
        try:
            for result in batch.results:
                result.fail(batch.partition, error)
            if failures and self.on_error is not None:
                _call_back(self.on_error, failures)
        finally:
            self.accumulator.release([batch])  # last, as in `_deliver`
