"""Sending encoded batches to partition leaders, pipelined (DESIGN §4, §11).

A `Batch` is the messages bound for one partition, encoded once into one message set.
`BatchSender.send` groups batches by their leader broker, packs at most one batch per
partition into each request (a PRODUCE for one part, a MULTIPRODUCE for several), and
keeps up to `max_in_flight` requests outstanding on every connection before reading
answers. Each batch ends with either `base_offset` set or `error` set; retrying is the
producer's business.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from dataclasses import dataclass

from broker.client.cluster import ConnectionPool
from broker.errors import ErrorCode, LogbusError, error_for
from broker.message import Codec, encode_message_set
from broker.protocol import (
    Acks, ApiKey, MultiProduceRequest, ProducePart, ProduceRequest, ProduceResponse, decode_multiproduce,
)

logger = logging.getLogger(__name__)

# Fewer than the broker's max.in.flight.requests.per.connection (100), so the broker
# never stops reading while we are still writing: no deadlock of two full buffers.
MAX_IN_FLIGHT = 32
# Requests written together in one syscall stop growing past this many bytes.
WRITE_BYTES = 1 << 20


@dataclass(eq=False)
class Batch:
    """Messages for one partition; `records` are `ProducerRecord`s (key, value, timestamp)."""

    topic: str
    partition: int
    records: list
    payload: bytes = b""
    leader: int = -1
    base_offset: int | None = None
    error: BaseException | None = None
    sent: bool = False  # the request was written (all acks=0 can promise)

    def encode(self, codec: Codec) -> None:
        self.payload = encode_message_set(((r.key, r.value, r.timestamp) for r in self.records), codec)


@dataclass
class _Request:
    batches: list[Batch]
    body: bytes = b""
    api: ApiKey = ApiKey.PRODUCE


class BatchSender:
    """Writes batches to leaders through a `ConnectionPool` it does not own."""

    def __init__(self, pool: ConnectionPool, acks: int, timeout_ms: int, max_in_flight: int = MAX_IN_FLIGHT,
                 durable_topics: frozenset[str] = frozenset()) -> None:
        self.pool = pool
        self.acks = int(acks)
        self.timeout_ms = timeout_ms
        self.max_in_flight = max_in_flight
        # Topics always sent with acks=-1 whatever `acks` is: the monitoring topic, whose
        # events are the audit's ground truth and must not vanish with an acks=0 producer.
        self.durable_topics = durable_topics

    def send(self, batches: list[Batch]) -> None:
        """Send every batch (its `leader` must be set); sets `base_offset` or `error`."""
        by_leader: dict[int, list[Batch]] = defaultdict(list)
        for batch in batches:
            by_leader[batch.leader].append(batch)
        for leader, group in by_leader.items():
            durable = [b for b in group if b.topic in self.durable_topics] if self.durable_topics else []
            if len(durable) < len(group):
                ordinary = [b for b in group if b.topic not in self.durable_topics] if durable else group
                self._send_to(leader, self._requests(ordinary, self.acks), self.acks)
            if durable:
                self._send_to(leader, self._requests(durable, Acks.FLUSHED), Acks.FLUSHED)

    def _requests(self, batches: list[Batch], acks: int) -> list[_Request]:
        """Round k holds the k-th batch of every partition, so one request never has
        two batches of a partition and their order on the broker is kept."""
        queues: dict[tuple[str, int], deque[Batch]] = defaultdict(deque)
        for batch in batches:
            queues[(batch.topic, batch.partition)].append(batch)
        if len(queues) == 1:  # one partition: a PRODUCE per batch, in order
            timeout = self.timeout_ms
            return [_Request([b], ProduceRequest(acks, timeout, b.topic, b.partition, b.payload).encode(), ApiKey.PRODUCE)
                    for b in batches]
        requests = []
        while queues:
            round_ = [q.popleft() for q in queues.values()]
            queues = {k: q for k, q in queues.items() if q}
            if len(round_) == 1:
                b = round_[0]
                body = ProduceRequest(acks, self.timeout_ms, b.topic, b.partition, b.payload).encode()
                requests.append(_Request(round_, body, ApiKey.PRODUCE))
            else:
                parts = [ProducePart(b.topic, b.partition, b.payload) for b in round_]
                body = MultiProduceRequest(acks, self.timeout_ms, parts).encode()
                requests.append(_Request(round_, body, ApiKey.MULTIPRODUCE))
        return requests

    def _send_to(self, leader: int, requests: list[_Request], acks: int) -> None:
        try:
            conn = self.pool.get(leader)
        except (ConnectionError, OSError) as exc:
            self._fail(requests, ConnectionError(str(exc)))
            return
        expects = acks != Acks.NONE
        waiting: deque[_Request] = deque()
        pending = deque(requests)
        try:
            while pending or waiting:
                # Write as many requests as the window allows in one syscall (at most
                # about WRITE_BYTES), then read answers until the window is half empty.
                room = self.max_in_flight - len(waiting) if expects else len(pending)
                if pending and room > 0:
                    group, size = [], 0
                    for request in pending:
                        if len(group) >= room or (group and size >= WRITE_BYTES):
                            break
                        group.append(request)
                        size += len(request.body)
                    conn.send_many([(r.api, r.body) for r in group], expects_response=expects)
                    for request in group:
                        pending.popleft()
                        for b in request.batches:
                            b.sent = True
                    if expects:
                        waiting.extend(group)
                low = self.max_in_flight // 2 if pending else 0
                while len(waiting) > low:
                    error_code, reader = conn.receive()
                    self._answer(waiting.popleft(), error_code, reader)  # popped after: a failed read fails it
        except (ConnectionError, OSError) as exc:
            self.pool.drop(leader)
            self._fail(list(waiting) + list(pending), ConnectionError(str(exc)))

    def _answer(self, request: _Request, error_code: int, reader) -> None:
        if error_code != ErrorCode.NONE:
            try:
                message = reader.string()
            except LogbusError:
                message = ""
            error = error_for(error_code, message)
            for b in request.batches:
                b.error = error
            return
        if request.api == ApiKey.PRODUCE:
            request.batches[0].base_offset = ProduceResponse.decode(reader).base_offset
            return
        for b, result in zip(request.batches, decode_multiproduce(reader)):
            if result.error_code == ErrorCode.NONE:
                b.base_offset = result.value.base_offset
            else:
                b.error = error_for(result.error_code, result.message)

    @staticmethod
    def _fail(requests: list[_Request], error: BaseException) -> None:
        for request in requests:
            for b in request.batches:
                if b.base_offset is None and b.error is None:
                    b.error = error
