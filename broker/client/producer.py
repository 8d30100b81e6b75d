"""The producer (docs/clients.md): `send(topic, value, key=None, timestamp=None, partition=None)`; `produce`.

Three parts, each with one job (kafka-python's split):

- the `RecordAccumulator` (`accumulator.py`) groups messages into per-partition
  batches and bounds how many are undelivered;
- the `Sender` (`sender.py`), one thread, owns the I/O: topic creation, the connection
  pool, pipelined requests (`pipeline.py`), retries, the delivery timeout;
- futures (`results.py`): every `send` returns a `RecordFuture` that resolves to the
  message's `RecordMetadata` (topic, partition, offset) or raises `ProduceError`
  whose `cause` is the broker's error, its class named by the wire error code.

``mode="sync"`` (the default) is ``mode="async"`` plus ``future.result()``: `send`
returns the `RecordMetadata` or raises. In async mode batches wait up to `linger_ms`
to fill; in sync mode they go at once (concurrent callers still share batches).
`send_many(topic, values)` adds many unkeyed messages under one lock and returns one
`ManyFuture` for the call (see its docstring).

At most `queue_size` messages may be undelivered; then `send` blocks
(``queue_full="block"``, at most `max_block_ms`) or raises `QueueFull`
(``queue_full="raise"``).

Failures are *reported*, never lost silently: besides the futures, `flush(timeout)`
and `close(timeout)` return a `DeliveryReport` — messages delivered and the `failed`
ones (each with its error) since the previous report, and how many were still
`pending`. `close` flushes, then fails whatever is still pending at its deadline, so
its report accounts for every message. Neither waits longer than its timeout, even
with every broker down.

With ``enable_idempotence=True`` (the default) retries never duplicate nor reorder a
partition's messages within the producer's lifetime: the producer gets an id from the
cluster and numbers its batches per partition, and a broker answers a batch it already
holds with that batch's offsets instead of appending it again (docs/clients.md,
"Idempotence"). A message's offset is then its batch's, as with compression.

With ``monitoring=True`` (the default) the producer counts what it delivered per topic and
window of message timestamps and publishes monitoring events (`broker.client.monitoring`).

Web servers fork: gunicorn's ``--preload`` or uWSGI create the app, and with it a
producer, in a master process that then forks its workers. A child inherits the
producer's objects but not its threads, and shares its sockets and ZooKeeper session
with the parent. So a producer made before a fork starts afresh in the child at its
first call: new metadata, connections, sender and producer id; the parent's undelivered
messages stay the parent's (the parent still delivers them), and nothing the child does
touches the parent's connections.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import weakref
from typing import Callable, Sequence

from broker.client.accumulator import RecordAccumulator
from broker.client.cluster import ConnectionPool
from broker.client.metadata import ClusterMetadata, open_metadata
from broker.client.errors import ProducerClosed
from broker.client.idempotence import IDEMPOTENT_BATCH_BYTES, MAX_IN_FLIGHT_PER_PARTITION, ProducerIdentity
from broker.client.monitoring import DEFAULT_WINDOW_MS, MONITORING_TOPIC, MonitoringCounter
from broker.client.partitioner import partition_for_key
from broker.client.pipeline import Pipeline
from broker.client.results import (
    DeliveredBatch, DeliveryReport, FailedSend, ManyFuture, RecordFuture, RecordMetadata, ReportBook,
)
from broker.client.security import OPEN, ClientSecurity
from broker.client.sender import Sender
from broker.client.settings import require_at_least
from broker.common.errors import UnknownPartition
from broker.common.compression import Codec
from broker.common.message import now_ms
from broker.common.protocol import Acks, check_topic_name

logger = logging.getLogger(__name__)
_now_ns = time.time_ns

__all__ = ["DeliveredBatch", "DeliveryReport", "FailedSend", "ManyFuture", "Producer", "RecordFuture",
           "RecordMetadata"]


def _as_bytes(data, what: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes or str, not {type(data).__name__}")


_live: "weakref.WeakSet[Producer]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """Mark every producer inherited by this child; its next call starts it afresh."""
    for producer in list(_live):
        producer._forked_from = producer._forked_from or producer._pid
        producer._closing = True  # the hot path's only check routes the next call to _restart
        producer._restart_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


# The floor of each numeric setting: below it the producer would fail every message, or
# later than where the setting was made.
_LOWEST = {"batch_size": 1, "batch_bytes": 1, "linger_ms": 0, "queue_size": 1, "max_block_ms": 0, "retries": 0,
           "retry_backoff_ms": 0, "delivery_timeout_ms": 1, "request_timeout_ms": 1, "monitoring_window_ms": 1}


def _check_settings(settings: dict) -> None:
    """Refuse settings that cannot work, naming the setting, before any connection."""
    require_at_least(settings, _LOWEST)
    if settings["mode"] == "async" and settings["delivery_timeout_ms"] <= settings["linger_ms"]:
        raise ValueError(f"delivery_timeout_ms ({settings['delivery_timeout_ms']}) must exceed linger_ms "
                         f"({settings['linger_ms']}): every batch would expire while it lingers")


class Producer:
    """Send messages to topics. Thread-safe; use as a context manager to close it.

    Give `zookeeper` (connect string, brokers and leaders are watched) or `brokers`
    (["host:port", ...], metadata by METADATA requests). Settings:

    - `acks`: 0 (no answer), 1 (appended), -1 (flushed to disk);
    - `enable_idempotence`: retries neither duplicate nor reorder (needs acks 1 or -1);
    - `compression`: None, "gzip" (or snappy/lz4/zstd with their packages);
    - `mode`: "sync" (`send` waits for its outcome) or "async" (`send` returns a future);
    - `batch_size`, `batch_bytes`, `linger_ms`: when an async batch is ready;
    - `queue_size`, `queue_full`, `max_block_ms`: the back-pressure policy;
    - `retries`, `retry_backoff_ms`: retriable errors (leader moved, broker down);
    - `delivery_timeout_ms`: a message not delivered within this time fails
      (it is how long a sync `send` may block while no leader is available);
    - `monitoring`, `monitoring_window_ms`, `monitoring_topic`: monitoring events (`broker.client.monitoring`);
    - `on_delivery(DeliveredBatch)` / `on_error(list[FailedSend])`: optional callbacks,
      run in the sender thread; keep them short.
    """

    def __init__(
        self,
        zookeeper: str | None = None,
        brokers: list[str] | str | None = None,
        *,
        acks: int = Acks.APPENDED,
        enable_idempotence: bool = True,
        compression: str | None = None,
        mode: str = "sync",
        batch_size: int = 200,
        batch_bytes: int = 1 << 20,
        linger_ms: int = 5,
        queue_size: int = 100_000,
        queue_full: str = "block",
        max_block_ms: int = 60_000,
        retries: int = 5,
        retry_backoff_ms: int = 100,
        delivery_timeout_ms: int = 30_000,
        request_timeout_ms: int = 30_000,
        monitoring: bool = True,
        monitoring_window_ms: int = DEFAULT_WINDOW_MS,
        monitoring_topic: str = MONITORING_TOPIC,
        client_id: str | None = None,
        on_delivery: Callable[[DeliveredBatch], None] | None = None,
        on_error: Callable[[list[FailedSend]], None] | None = None,
        metadata: ClusterMetadata | None = None,
        zookeeper_timeout: float = 10.0,
        security: ClientSecurity = OPEN,
    ) -> None:
        self._settings = {name: value for name, value in locals().items() if name != "self"}  # for _restart
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', not {mode!r}")
        if queue_full not in ("block", "raise"):
            raise ValueError(f"queue_full must be 'block' or 'raise', not {queue_full!r}")
        if int(acks) not in (0, 1, -1):
            raise ValueError(f"acks must be 0, 1 or -1, not {acks!r}")
        if enable_idempotence and int(acks) == Acks.NONE:
            raise ValueError("enable_idempotence=True needs acks=1 or acks=-1: with acks=0 no answer says whether a "
                             "batch arrived, so there is nothing to retry or dedupe; set enable_idempotence=False")
        _check_settings(self._settings)
        self.mode = mode
        self.acks = int(acks)
        self.codec = Codec.parse(compression)
        self.delivery_timeout = delivery_timeout_ms / 1000
        self.max_block = max_block_ms / 1000
        self.producer_id = str(uuid.uuid4())
        self.client_id = client_id or f"logbus-producer-{self.producer_id[:8]}"
        self._owns_metadata = metadata is None
        self.metadata = metadata or open_metadata(zookeeper, brokers, self.client_id, zookeeper_timeout, security)
        self.pool = ConnectionPool(self.metadata, self.client_id, request_timeout_ms / 1000 + 5)
        self.monitoring = (MonitoringCounter(self.producer_id, monitoring_window_ms, monitoring_topic)
                           if monitoring else None)
        self.accumulator = RecordAccumulator(
            self.metadata, batch_size=batch_size,
            batch_bytes=min(batch_bytes, IDEMPOTENT_BATCH_BYTES) if enable_idempotence else batch_bytes,
            linger=linger_ms / 1000 if mode == "async" else 0.0, queue_size=queue_size, queue_full=queue_full,
            max_block=self.max_block, exact_offsets=self.codec is Codec.NONE and not enable_idempotence,
            retry_backoff=retry_backoff_ms / 1000,
            max_in_flight_per_partition=MAX_IN_FLIGHT_PER_PARTITION if enable_idempotence else 0,
        )
        self._report = ReportBook()
        durable = frozenset([self.monitoring.monitoring_topic]) if self.monitoring else frozenset()
        self.sender = Sender(
            self.accumulator, self.metadata, self.pool, Pipeline(self.pool, self.acks, request_timeout_ms,
                                                                 durable_topics=durable),
            self.codec, self._report, retries=retries, retry_backoff=retry_backoff_ms / 1000,
            delivery_timeout=self.delivery_timeout, monitoring=self.monitoring, on_delivery=on_delivery,
            on_error=on_error, name=f"{self.client_id}-sender",
            idempotence=ProducerIdentity() if enable_idempotence else None,
        )
        # Partition counts of topics met (a key's partition needs only the count, which
        # does not change); also the cache of names that passed check_topic_name.
        self._partition_counts: dict[str, int] = {}
        self._sync = mode == "sync"
        self._result_timeout = self.delivery_timeout + request_timeout_ms / 1000 + 5
        self._closed = False
        self._closing = False
        self._pid = os.getpid()
        self._forked_from: int | None = None
        self.sender.start()
        _live.add(self)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------ send

    def send(self, topic: str, value: bytes | str, key: bytes | str | None = None, timestamp: int | None = None,
             partition: int | None = None) -> RecordFuture | RecordMetadata:
        """Send one message. Async mode: returns its `RecordFuture`. Sync mode:
        returns ``future.result()`` — where it landed — or raises `ProduceError`."""
        if self._closing:
            self._restart()
        count = self._partition_counts.get(topic)
        if count is None:
            count = self._find_topic(topic)
            if isinstance(count, BaseException):
                return self._settle(self._refused(topic, key, value, timestamp, partition, count))
        if type(value) is not bytes:
            value = _as_bytes(value, "value")
        if key is not None:
            key = _as_bytes(key, "key")
            if partition is None:
                partition = partition_for_key(key, count)
        if partition is not None and not 0 <= partition < count:
            return self._settle(self._refused(topic, key, value, timestamp, partition,
                                              UnknownPartition(f"topic {topic!r} has no partition {partition}")))
        future = self.accumulator.append(topic, key, value, _now_ns() // 1_000_000 if timestamp is None
                                         else int(timestamp), partition)
        return future.result(self._result_timeout) if self._sync else future

    def produce(self, topic: str, value: bytes | str, key: bytes | str | None = None, timestamp: int | None = None,
                partition: int | None = None) -> None:
        """`send` without a future: confluent-kafka's `produce`, Kafka 0.7's async `send`.
        Delivery is told by `on_delivery` and `on_error`, and counted in the report of
        `flush` and `close`. A future is an object a message, allocated and freed: a
        fifth of the caller's cost at batch 50 (BENCHMARKS.md, issue 38). In sync mode,
        and for a message `send` would refuse or must look a topic up for, it is `send`."""
        count = self._partition_counts.get(topic)
        if (self._sync or self._closing or count is None or type(value) is not bytes or (
                key is not None and type(key) is not bytes) or (partition is not None and not 0 <= partition < count)):
            self.send(topic, value, key, timestamp, partition)  # looked up, converted, or refused and reported
            return
        if key is not None and partition is None:
            partition = partition_for_key(key, count)
        self.accumulator.append(topic, key, value, _now_ns() // 1_000_000 if timestamp is None else int(timestamp),
                                partition, False)

    def _settle(self, future: RecordFuture) -> RecordFuture | RecordMetadata:
        return future.result(self._result_timeout) if self._sync else future

    def send_many(self, topic: str, values: Sequence[bytes | str], timestamp: int | None = None,
                  key: bytes | str | None = None, partition: int | None = None) -> ManyFuture | int:
        """Send many messages to `topic` at once: whole slices go into batches under one
        lock per batch, with one `ManyFuture` for the call (no per-message future or
        offset — use `send` for those). All messages get one timestamp (now, or
        `timestamp`) and one `key` (none by default), and go to `partition`, else the
        key's partition, else sticky batches. Async mode: returns the future; sync mode:
        its result, the number of messages, or raises `ProduceError`."""
        if self._closing:
            self._restart()
        if not all(type(v) is bytes for v in values):
            values = [_as_bytes(v, "value") for v in values]
        key = None if key is None else _as_bytes(key, "key")
        timestamp = now_ms() if timestamp is None else int(timestamp)
        found = self._partition_counts.get(topic) or self._find_topic(topic)
        if not isinstance(found, BaseException):
            if key is not None and partition is None:
                partition = partition_for_key(key, found)
            if partition is not None and not 0 <= partition < found:
                found = UnknownPartition(f"topic {topic!r} has no partition {partition}")
        if isinstance(found, BaseException):
            future = ManyFuture([self._refused(topic, key, v, timestamp, partition, found).batch for v in values[:1]],
                                len(values))
            for value in values[1:]:
                self._refused(topic, key, value, timestamp, partition, found)
        else:
            future = self.accumulator.append_many(topic, list(values), timestamp, key, partition)
        return future.result(self._result_timeout) if self._sync else future

    def _restart(self) -> None:
        """In a forked child, start afresh (module docstring); else the producer is closed.
        The inherited threads are gone and the sockets are the parent's: they are dropped,
        never closed or written to."""
        lock = getattr(self, "_restart_lock", None)
        if lock is None or self._closed:
            raise ProducerClosed("send after close()")
        with lock:
            if self._forked_from is None:
                if self._closing:
                    raise ProducerClosed("send after close()")
                return  # another thread of this child restarted it
            if not self._owns_metadata:
                raise ProducerClosed(
                    f"producer made in process {self._forked_from} used in forked process {os.getpid()} with a "
                    "metadata object it was given: make the metadata and the producer after the fork")
            logger.info("producer %s made in process %s starts afresh in forked process %s",
                        self.client_id, self._forked_from, os.getpid())
            self.__init__(**self._settings)

    def _find_topic(self, topic: str) -> int | BaseException:
        """The topic's partition count, waiting for the sender to find or create it;
        or the error to fail its messages with."""
        check_topic_name(topic)
        leaders = self.metadata.partitions(topic)
        if leaders:
            count = len(leaders)
        else:
            try:
                count = self.sender.topic_partitions(topic, time.monotonic() + min(self.max_block,
                                                                                     self.delivery_timeout))
            except Exception as exc:
                return exc
        self._partition_counts[topic] = count
        return count

    def _refused(self, topic, key, value, timestamp, partition, error: BaseException) -> RecordFuture:
        """A message that cannot go anywhere: failed at once, and in the report."""
        value = _as_bytes(value, "value")
        key = None if key is None else _as_bytes(key, "key")
        failure = FailedSend(topic, key, value, now_ms() if timestamp is None else int(timestamp), partition, error)
        self._report.failed([failure])
        if self.sender.on_error is not None:
            self.sender.on_error([failure])
        return RecordFuture.failed(topic, error)

    # --------------------------------------------------------------- flush, close

    def flush(self, timeout: float | None = None) -> DeliveryReport:
        """Send everything queued now (ignoring linger) and publish monitoring events;
        wait until nothing is outstanding or `timeout` seconds pass. Returns the
        report since the previous one; its `pending` says what the timeout left."""
        if self._forked_from is not None:
            return DeliveryReport()  # nothing sent in this process yet; the rest is the parent's
        deadline = time.monotonic() + (timeout if timeout is not None else self.delivery_timeout + 5)
        self._wait_idle(deadline)
        return self._report.take(self.accumulator.outstanding)

    def _wait_idle(self, deadline: float) -> None:
        accumulator, sender = self.accumulator, self.sender
        with_monitoring = self.monitoring is not None
        accumulator.begin_flush()
        try:
            sender.request_publish()
            while accumulator.wait_until_idle(deadline, lambda: sender.publish_requested and sender.alive()):
                if not with_monitoring or not self.monitoring.pending() or not sender.alive():
                    break
                sender.request_publish()  # counts of messages delivered after that publish
        finally:
            accumulator.end_flush()

    def close(self, timeout: float = 30.0) -> DeliveryReport:
        """Flush within `timeout` seconds, stop the sender, release connections.
        Returns the final report: every message sent since the previous report is in
        `delivered` or in `failed` (pending ones fail here with TimeoutError)."""
        if self._closed or self._forked_from is not None:
            self._closed = True  # inherited, never used here: the parent's to close
            return DeliveryReport()
        self._closing = True
        deadline = time.monotonic() + timeout
        self.accumulator.begin_flush()  # never ended: a closing producer sends what it has at once
        self.sender.stop(deadline)
        self.sender.join(deadline - time.monotonic())
        for batch in self.accumulator.abandon():
            self.sender.fail(batch, TimeoutError(
                f"not delivered before close() timed out after {timeout:g}s (messages in flight may have arrived)"))
        self._closed = True
        report = self._report.take(0)
        if report.failed:
            logger.warning("producer %s closed: %s", self.client_id, report)
        if not self.sender.alive():
            self.pool.close()  # a sender stuck in a socket call still owns its connections
        if self._owns_metadata:
            self.metadata.close()
        return report
