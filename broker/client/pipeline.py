"""Writing encoded batches to partition leaders, pipelined (docs/protocol.md, "Frames";
docs/clients.md, "Producer").

`Pipeline.send` groups batches by their leader broker, packs at most one batch per
partition into each request (a PRODUCE for one part, a MULTIPRODUCE for several), and
keeps up to `max_in_flight` requests outstanding on every connection before reading
answers. It returns one outcome per batch — its base offset, or the error the broker
answered with (the class its error code names) or the connection failed with;
retrying is the sender's business.
"""

from __future__ import annotations

import struct
from collections import defaultdict, deque
from functools import partial
from typing import NamedTuple

from broker.client.cluster import ConnectionPool
from broker.common.errors import ErrorCode, LogbusError, error_for
from broker.common.protocol import (
    Acks, ApiKey, MultiProduceRequest, ProducePart, ProduceRequest, ProduceResponse, decode_multiproduce,
    raise_for_error,
)

# Fewer than the broker's max.in.flight.requests.per.connection (100), so the broker
# never stops reading while we are still writing: no deadlock of two full buffers.
MAX_IN_FLIGHT = 32
# Requests written together in one syscall stop growing past this many bytes.
WRITE_BYTES = 1 << 20
_SIZE = struct.Struct(">i")
# Enum members as constants on a hot path (docs/architecture.md, "Enum members on hot paths").
_PRODUCE, _MULTIPRODUCE, _NO_ACKS, _OK = ApiKey.PRODUCE, ApiKey.MULTIPRODUCE, Acks.NONE, ErrorCode.NONE


class Outgoing(NamedTuple):
    """A batch on its way: `batch` is the caller's (opaque here), `payload` its
    encoded message set."""

    batch: object
    topic: str
    partition: int
    leader: int
    payload: bytes


class Outcome(NamedTuple):
    """`base_offset` (-1 with acks=0) when delivered, else `error`."""

    batch: object
    base_offset: int
    error: BaseException | None


class _Request(NamedTuple):
    """A request's batches and body: bytes, or a PRODUCE's pieces (joined into the frame,
    not before: `BrokerConnection.send_many`)."""

    parts: list[Outgoing]
    body: bytes | tuple[bytes, ...]
    api: ApiKey
    size: int


# NamedTuple's `__new__` is Python code: a frame per batch, a tenth of the sender's time
# at batch 1. These make the same tuples in C, from a tuple of the fields in order.
new_outgoing = partial(tuple.__new__, Outgoing)
_new_outcome = partial(tuple.__new__, Outcome)
_new_request = partial(tuple.__new__, _Request)


class Pipeline:
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
        self._heads: dict[tuple[str, int, int], bytes] = {}  # a PRODUCE's bytes before its set's size

    def send(self, batches: list[Outgoing]) -> list[Outcome]:
        """Send every batch to its leader; one outcome per batch."""
        outcomes: list[Outcome] = []
        by_leader: dict[int, list[Outgoing]] = defaultdict(list)
        for out in batches:
            by_leader[out.leader].append(out)
        for leader, group in by_leader.items():
            durable = [b for b in group if b.topic in self.durable_topics] if self.durable_topics else []
            if len(durable) < len(group):
                ordinary = [b for b in group if b.topic not in self.durable_topics] if durable else group
                self._send_to(leader, self._requests(ordinary, self.acks), self.acks, outcomes)
            if durable:
                self._send_to(leader, self._requests(durable, Acks.FLUSHED), Acks.FLUSHED, outcomes)
        return outcomes

    def _requests(self, batches: list[Outgoing], acks: int) -> list[_Request]:
        """Round k holds the k-th batch of every partition, so one request never has
        two batches of a partition and their order on the broker is kept."""
        queues: dict[tuple[str, int], deque[Outgoing]] = defaultdict(deque)
        for out in batches:
            queues[(out.topic, out.partition)].append(out)
        if len(queues) == 1:  # one partition: a PRODUCE per batch, in order, one head for all (batch 1's path)
            head = self._head(batches[0], acks)
            size, pack = len(head) + 4, _SIZE.pack
            return [_new_request(([out], (head, pack(len(out.payload)), out.payload), _PRODUCE, size + len(out.payload)))
                    for out in batches]
        requests = []
        while queues:
            round_ = [q.popleft() for q in queues.values()]
            queues = {k: q for k, q in queues.items() if q}
            if len(round_) == 1:
                requests.append(self._produce(round_[0], acks))
            else:
                parts = [ProducePart(b.topic, b.partition, b.payload) for b in round_]
                body = MultiProduceRequest(acks, self.timeout_ms, parts).encode()
                requests.append(_Request(round_, body, _MULTIPRODUCE, len(body)))
        return requests

    def _head(self, out: Outgoing, acks: int) -> bytes:
        """A PRODUCE's bytes before its set's size: the same for every batch of a
        partition, encoded once (at batch 1 the encoding was a tenth of the sender)."""
        head = self._heads.get((out.topic, out.partition, acks))
        if head is None:
            empty = ProduceRequest(acks, self.timeout_ms, out.topic, out.partition, b"").encode()
            head = self._heads[(out.topic, out.partition, acks)] = empty[:-4]  # without the set's size
        return head

    def _produce(self, out: Outgoing, acks: int) -> _Request:
        """A PRODUCE of one batch; the set is copied once, into the frame."""
        head, payload = self._head(out, acks), out.payload
        return _new_request(([out], (head, _SIZE.pack(len(payload)), payload), _PRODUCE, len(head) + 4 + len(payload)))

    def _send_to(self, leader: int, requests: list[_Request], acks: int, outcomes: list[Outcome]) -> None:
        try:
            conn = self.pool.get(leader)
        except (ConnectionError, OSError) as exc:
            self._fail(requests, ConnectionError(str(exc)), outcomes)
            return
        expects = acks != _NO_ACKS
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
                        size += request.size
                    conn.send_many([(r.api, r.body, r.size) for r in group], expects_response=expects)
                    for _ in group:
                        pending.popleft()
                    if expects:
                        waiting.extend(group)
                    else:  # acks=0: written is all the broker will ever say
                        outcomes.extend(_new_outcome((b.batch, -1, None)) for r in group for b in r.parts)
                low = self.max_in_flight // 2 if pending else 0
                while len(waiting) > low:
                    error_code, reader = conn.receive()
                    outcomes.extend(self._answer(waiting[0], error_code, reader))
                    waiting.popleft()  # popped after: a failed read fails it
        except (ConnectionError, OSError) as exc:
            self.pool.drop(leader)
            self._fail(list(waiting) + list(pending), ConnectionError(str(exc)), outcomes)

    @staticmethod
    def _answer(request: _Request, error_code: int, reader) -> list[Outcome]:
        try:
            raise_for_error(error_code, reader)
        except LogbusError as exc:
            return [Outcome(b.batch, -1, exc) for b in request.parts]
        if request.api == _PRODUCE:
            return [_new_outcome((request.parts[0].batch, ProduceResponse.decode(reader).base_offset, None))]
        return [
            Outcome(b.batch, result.value.base_offset, None) if result.error_code == _OK
            else Outcome(b.batch, -1, error_for(result.error_code, result.message))
            for b, result in zip(request.parts, decode_multiproduce(reader))
        ]

    @staticmethod
    def _fail(requests: list[_Request], error: BaseException, outcomes: list[Outcome]) -> None:
        outcomes.extend(Outcome(b.batch, -1, error) for r in requests for b in r.parts)
