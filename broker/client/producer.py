"""The producer (DESIGN §6): `send(topic, value, key=None, timestamp=None, partition=None)`.

Two modes share one delivery loop (`broker.client.delivery`):

- ``mode="sync"``: `send` delivers the message before it returns and gives back a
  `RecordMetadata` (partition and offset; offset -1 with ``acks=0``), or raises
  `ProduceError` once retries and `delivery_timeout_ms` are spent.
- ``mode="async"``: `send` queues the message and returns None at once; a background
  sender thread batches per partition (`batch_size` messages, `batch_bytes`, or
  `linger_ms`, whichever first) and pipelines one request per round to each broker.
  The queue holds at most `queue_size` undelivered messages; when it is full `send`
  blocks (``queue_full="block"``, at most `max_block_ms`) or raises `QueueFull`
  (``queue_full="raise"``).

Failures in async mode are *reported*, never lost silently: `flush(timeout)` and
`close(timeout)` return a `DeliveryReport` — messages delivered and the `failed` ones
(each with its error) since the previous report, and how many were still `pending`.
`close` turns whatever is still pending at its deadline into failures, so its report
accounts for every message. `on_error(failed_sends)` is called as failures happen.
Neither `flush` nor `close` waits longer than its timeout, even with every broker down.

With ``audit=True`` (the default) the producer counts what it delivered per topic and
window of message timestamps and publishes monitoring events (`broker.audit`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from broker.client.audit import AUDIT_TOPIC, DEFAULT_WINDOW_MS, AuditCounter
from broker.client.cluster import ClusterMetadata, ConnectionPool, open_metadata
from broker.client.delivery import Delivery, ProducerRecord
from broker.client.errors import PartitionUnavailable, ProduceError, ProducerClosed, QueueFull
from broker.client.sender import Batch, BatchSender
from broker.message import Codec, now_ms
from broker.protocol import Acks, check_topic_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordMetadata:
    """Where a sync `send` put its message. `offset` is -1 with acks=0; inside a
    compressed batch it is the offset of the wrapper entry."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class FailedSend:
    """A message the producer gave up on, and why."""

    topic: str
    key: bytes | None
    value: bytes
    timestamp: int
    partition: int | None
    error: BaseException


@dataclass
class DeliveryReport:
    """What happened to the messages since the previous report.

    `delivered`: acknowledged by the broker (with acks=0: written to the socket);
    `failed`: given up, with errors; `pending`: still queued or in flight when the
    report was made (only a `flush` that timed out has pending messages).
    """

    delivered: int = 0
    failed: list[FailedSend] = field(default_factory=list)
    pending: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed and not self.pending

    def __str__(self) -> str:
        return f"{self.delivered} delivered, {len(self.failed)} failed, {self.pending} pending"


def _as_bytes(data, what: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes or str, not {type(data).__name__}")


class Producer:
    """Send messages to topics. Thread-safe; use as a context manager to close it.

    Give `zookeeper` (connect string, brokers and leaders are watched) or `brokers`
    (["host:port", ...], metadata by METADATA requests). Settings:

    - `acks`: 0 (no answer), 1 (appended), -1 (flushed to disk);
    - `compression`: None, "gzip" (or snappy/lz4/zstd with their packages);
    - `batch_size`, `batch_bytes`, `linger_ms`: when an async batch is ready;
    - `queue_size`, `queue_full`, `max_block_ms`: the async back-pressure policy;
    - `retries`, `retry_backoff_ms`: retriable errors (leader moved, broker down);
    - `delivery_timeout_ms`: a message not delivered within this time fails
      (it is how long a sync `send` may block while no leader is available);
    - `audit`, `audit_window_ms`, `audit_topic`: monitoring events (`broker.audit`);
    - `on_delivery(batch)` / `on_error(list[FailedSend])`: optional callbacks, run in
      the thread that delivers (the sender thread in async mode); keep them short.
    """

    def __init__(
        self,
        zookeeper: str | None = None,
        brokers: list[str] | str | None = None,
        *,
        acks: int = Acks.APPENDED,
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
        audit: bool = True,
        audit_window_ms: int = DEFAULT_WINDOW_MS,
        audit_topic: str = AUDIT_TOPIC,
        client_id: str | None = None,
        on_delivery: Callable[[Batch], None] | None = None,
        on_error: Callable[[list[FailedSend]], None] | None = None,
        metadata: ClusterMetadata | None = None,
        zookeeper_timeout: float = 10.0,
    ) -> None:
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', not {mode!r}")
        if queue_full not in ("block", "raise"):
            raise ValueError(f"queue_full must be 'block' or 'raise', not {queue_full!r}")
        if int(acks) not in (0, 1, -1):
            raise ValueError(f"acks must be 0, 1 or -1, not {acks!r}")
        self.mode = mode
        self.acks = int(acks)
        self.codec = Codec.parse(compression)
        self.queue_size = queue_size
        self.queue_full = queue_full
        self.max_block = max_block_ms / 1000
        self.delivery_timeout = delivery_timeout_ms / 1000
        self.producer_id = str(uuid.uuid4())
        self.client_id = client_id or f"logbus-producer-{self.producer_id[:8]}"
        self._owns_metadata = metadata is None
        self.metadata = metadata or open_metadata(zookeeper, brokers, self.client_id, zookeeper_timeout)
        self.pool = ConnectionPool(self.metadata, self.client_id, request_timeout_ms / 1000 + 5)
        self.audit = AuditCounter(self.producer_id, audit_window_ms, audit_topic) if audit else None
        self._on_delivery = on_delivery
        self._on_error = on_error
        self.delivery = Delivery(
            self.metadata, self.pool,
            BatchSender(self.pool, self.acks, request_timeout_ms,
                        durable_topics=frozenset([self.audit.audit_topic]) if self.audit else frozenset()),
            self.codec,
            batch_size if mode == "async" else 1 << 30, batch_bytes, linger_ms / 1000, retries,
            retry_backoff_ms / 1000, self.delivery_timeout, self._delivered, self._failed,
            track_offsets=(mode == "sync"),
        )
        # `_cond` guards the queue, `_outstanding`, the report counters and the flags.
        self._cond = threading.Condition()
        self._queue: deque[ProducerRecord] = deque()
        self._outstanding = 0
        self._report = DeliveryReport()
        self._closed = False
        self._closing = False
        self._close_deadline = float("inf")
        self._publish_requested = False
        self._flushing = 0
        self._valid_topics: set[str] = set()  # names that passed check_topic_name (a regex per send is measurable)
        self._sync_lock = threading.Lock()  # one sync send at a time: the delivery loop is single-threaded
        self._thread: threading.Thread | None = None
        if mode == "async":
            self._thread = threading.Thread(target=self._run, name=f"{self.client_id}-sender", daemon=True)
            self._thread.start()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------ send

    def send(self, topic: str, value: bytes | str, key: bytes | str | None = None, timestamp: int | None = None,
             partition: int | None = None) -> RecordMetadata | None:
        """Send one message. Sync mode: returns where it landed, or raises
        `ProduceError`. Async mode: queues it and returns None."""
        if self._closed or self._closing:
            raise ProducerClosed("send after close()")
        if topic not in self._valid_topics:
            self._valid_topics.add(check_topic_name(topic))
        record = ProducerRecord(
            topic, None if key is None else _as_bytes(key, "key"), _as_bytes(value, "value"),
            now_ms() if timestamp is None else int(timestamp), partition,
        )
        if self.mode == "async":
            self._enqueue(record)
            return None
        with self._sync_lock:
            self._deliver_now([record], time.monotonic() + self.delivery_timeout + 1)
            if self.audit is not None and self.audit.due():
                self._publish_audit_now(time.monotonic() + self.delivery_timeout)
        if record.error is not None:
            raise ProduceError(f"could not send to {topic}: {type(record.error).__name__}: {record.error}",
                               record.error) from record.error
        return RecordMetadata(topic, record.partition, record.offset if record.offset is not None else -1)

    def _enqueue(self, record: ProducerRecord) -> None:
        with self._cond:
            if self._outstanding >= self.queue_size:
                if self.queue_full == "raise":
                    raise QueueFull(f"{self._outstanding} messages are waiting to be sent (queue_size={self.queue_size})")
                deadline = time.monotonic() + self.max_block
                while self._outstanding >= self.queue_size and not self._closing:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise QueueFull(f"queue still full after blocking {self.max_block:g}s")
                    self._cond.wait(left)
                if self._closing:
                    raise ProducerClosed("send after close()")
            self._queue.append(record)
            self._outstanding += 1
            if len(self._queue) == 1:
                self._cond.notify_all()

    # ----------------------------------------------------------------- outcomes

    def _delivered(self, batch: Batch) -> None:
        user = [r for r in batch.records if not r.internal] if batch.topic == self._audit_topic else batch.records
        if self.audit is not None:
            self.audit.record(batch.topic, user)
        with self._cond:
            self._report.delivered += len(user)
            self._outstanding -= len(batch.records)
            self._cond.notify_all()
        if self._on_delivery is not None:
            self._on_delivery(batch)

    def _failed(self, records: list[ProducerRecord]) -> None:
        user = [r for r in records if not r.internal]
        internal = len(records) - len(user)
        if internal:
            logger.warning("could not publish %d monitoring events: %s", internal, records[0].error)
        failures = [FailedSend(r.topic, r.key, r.value, r.timestamp, r.partition, r.error) for r in user]
        with self._cond:
            self._report.failed.extend(failures)
            self._outstanding -= len(records)
            self._cond.notify_all()
        if failures and self._on_error is not None:
            self._on_error(failures)

    @property
    def _audit_topic(self) -> str | None:
        return self.audit.audit_topic if self.audit is not None else None

    def _take_report(self) -> DeliveryReport:
        with self._cond:
            report, self._report = self._report, DeliveryReport()
            report.pending = self._outstanding
        return report

    # ------------------------------------------------------------------- sync mode

    def _deliver_now(self, records: list[ProducerRecord], deadline: float) -> None:
        """Run delivery rounds in the caller's thread until `records` are done."""
        with self._cond:
            self._outstanding += len(records)
        self.delivery.add(records)
        while not all(r.done for r in records):
            wait = self.delivery.run_once(flush=True)
            if all(r.done for r in records):
                break
            if time.monotonic() >= deadline:
                left = self.delivery.abandon()
                self.delivery.abandoned = False
                for r in left:
                    r.error = r.error or PartitionUnavailable(f"not delivered to {r.topic} in time: no live leader")
                    r.done = True
                self._failed(left)
                break
            time.sleep(min(wait, max(0.0, deadline - time.monotonic())))

    def _audit_records(self) -> list[ProducerRecord]:
        if self.audit is None:
            return []
        return [ProducerRecord(self.audit.audit_topic, key, value, now_ms(), None, internal=True)
                for key, value in self.audit.events()]

    def _publish_audit_now(self, deadline: float) -> None:
        records = self._audit_records()
        if records:
            self._deliver_now(records, deadline)

    # ------------------------------------------------------------------ async mode

    def _run(self) -> None:
        """The sender thread: drain the queue into the delivery loop, run rounds."""
        wait = 0.0
        while True:
            with self._cond:
                if not self._queue and not self._publish_requested:
                    if self._closing:
                        self._cond.wait(max(0.0, min(wait, self._close_deadline - time.monotonic())))
                    else:
                        self._cond.wait(wait if wait > 0 else None)
                drained, self._queue = self._queue, deque()
                closing, flushing = self._closing, self._flushing > 0 or self._closing
                publish, self._publish_requested = self._publish_requested, False
                if drained:
                    self._cond.notify_all()
            if closing and time.monotonic() >= self._close_deadline:
                return  # close() reports what is left
            if drained:
                self.delivery.add(drained)
            if self.audit is not None and (publish or self.audit.due()):
                events = self._audit_records()
                with self._cond:
                    self._outstanding += len(events)
                self.delivery.add(events)
            try:
                wait = self.delivery.run_once(flush=flushing)
            except Exception:  # a bug must not silently stop delivery; report and go on
                logger.exception("producer sender round failed")
                wait = 0.1
            if self.delivery.abandoned:
                return
            with self._cond:
                if closing and self._outstanding == 0 and not self._queue:
                    if self.audit is None or not self.audit.pending():
                        return
                    self._publish_requested = True  # messages delivered after the last publish

    # --------------------------------------------------------------- flush, close

    def flush(self, timeout: float | None = None) -> DeliveryReport:
        """Send everything queued now (ignoring linger) and publish monitoring events;
        wait until nothing is outstanding or `timeout` seconds pass. Returns the
        report since the previous one; its `pending` says what the timeout left."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.delivery_timeout + 5)
        if self.mode == "sync":
            with self._sync_lock:
                self._publish_audit_now(deadline)
            return self._take_report()
        with self._cond:
            self._flushing += 1
            self._publish_requested = True
            self._cond.notify_all()
            try:
                while True:
                    if self._outstanding == 0 and not self._publish_requested:
                        if self.audit is None or not self.audit.pending():
                            break
                        self._publish_requested = True  # counts of messages delivered after the publish
                        self._cond.notify_all()
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._thread.is_alive():
                        break
                    self._cond.wait(left)
            finally:
                self._flushing -= 1
        return self._take_report()

    def close(self, timeout: float = 30.0) -> DeliveryReport:
        """Deliver what is pending within `timeout` seconds, publish the last monitoring
        events, release connections. Returns the final report: every message sent since
        the previous report is in `delivered` or in `failed` (pending ones fail here)."""
        if self._closed:
            return DeliveryReport()
        deadline = time.monotonic() + timeout
        if self.mode == "async":
            with self._cond:
                self._closing = True
                self._close_deadline = deadline
                self._publish_requested = True
                self._cond.notify_all()
            self._thread.join(max(0.0, deadline - time.monotonic()))
            with self._cond:
                left, self._queue = list(self._queue), deque()
        else:
            with self._sync_lock:
                self._closing = True
                self._publish_audit_now(deadline)
            left = []
        left += self.delivery.abandon()
        if left:
            for r in left:
                r.done = True
                r.error = r.error or TimeoutError(
                    f"not delivered before close() timed out after {timeout:g}s (messages in flight may have arrived)")
            self._failed(left)
        self._closed = True
        report = self._take_report()
        report.pending = 0
        if report.failed:
            logger.warning("producer %s closed: %s", self.client_id, report)
        if self._thread is None or not self._thread.is_alive():
            self.pool.close()  # a sender stuck in a socket call still owns its connections
        if self._owns_metadata:
            self.metadata.close()
        return report
