"""Writing encoded batches to partition leaders, pipelined (docs/protocol.md, "Frames";
docs/clients.md, "Producer").

`Pipeline.send` groups batches by their leader broker, packs at most one batch per
partition into each request (a PRODUCE for one part, a MULTIPRODUCE for several), and
keeps up to `max_in_flight` requests outstanding on every connection before reading
answers. It returns one outcome per batch — its base offset, or the error the broker
answered with (the class its error code names) or the connection failed with;
retrying is the sender's business.

Given an `encode`, it encodes each batch just before writing its request, a few dozen
kilobytes at a time (`WRITE_BYTES`): the broker works on the first requests while the
rest are encoded, instead of both sides taking turns (BENCHMARKS.md, issue 38).
`send` is `write` then `answers`; between the two the caller may do other work (the
idempotent sender encodes its next round) while the broker appends this one.
"""

from __future__ import annotations

import struct
from collections import defaultdict, deque
from functools import partial
from typing import Callable, NamedTuple

from broker.client.cluster import ConnectionPool
from broker.client.connection import BrokerConnection
from broker.common.errors import ErrorCode, LogbusError, error_for
from broker.common.protocol import (
    Acks, ApiKey, MultiProduceRequest, ProducePart, ProduceRequest, ProduceResponse, decode_multiproduce,
    raise_for_error,
)

# Fewer than the broker's max.in.flight.requests.per.connection (100), so the broker
# never stops reading while we are still writing: no deadlock of two full buffers.
MAX_IN_FLIGHT = 32
# Requests written together in one syscall stop growing past this many bytes: a few
# hundred batch-1 requests, a few of batch 50, and soon enough that the broker is busy
# with them while the next ones are encoded.
WRITE_BYTES = 64 << 10
_SIZE = struct.Struct(">i")
# Enum members as constants on a hot path (docs/architecture.md, "Enum members on hot paths").
_PRODUCE, _MULTIPRODUCE, _NO_ACKS, _OK = ApiKey.PRODUCE, ApiKey.MULTIPRODUCE, Acks.NONE, ErrorCode.NONE


class Outgoing(NamedTuple):
    """A batch on its way: `batch` is the caller's (opaque here), `payload` its
    encoded message set, or None for `Pipeline.send`'s `encode` to make when written."""

    batch: object
    topic: str
    partition: int
    leader: int
    payload: bytes | None


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
        self._encode: Callable[[object], bytes] | None = None  # `write`'s, for the batches it writes
        self._outcomes: list[Outcome] = []  # known since the last `answers`
        self._unanswered: list[tuple[int, BrokerConnection, deque[_Request]]] = []  # per leader, in write order

    def send(self, batches: list[Outgoing], encode: Callable[[object], bytes] | None = None) -> list[Outcome]:
        """Send every batch to its leader; one outcome per batch."""
        self.write(batches, encode)
        return self.answers()

    @property
    def unanswered(self) -> bool:
        """Some batch written has an outcome `answers` has not returned yet: an answer
        not read, or a failure (a lost connection) or acks=0's delivery known at write."""
        return bool(self._unanswered or self._outcomes)

    def answers(self) -> list[Outcome]:
        """Read the answers still due; one outcome per batch written since the last call."""
        unanswered, self._unanswered = self._unanswered, []
        for leader, conn, waiting in unanswered:
            self._read(leader, conn, waiting, 0)
        outcomes, self._outcomes = self._outcomes, []
        return outcomes

    def write(self, batches: list[Outgoing], encode: Callable[[object], bytes] | None = None) -> None:
        """Write every batch to its leader, reading answers only as each connection's
        window needs (`answers` reads the rest). Batches without a payload are encoded
        by `encode(batch)` as their requests are written, in each partition's order;
        one it fails to encode gets the exception as its outcome."""
        self._encode = encode
        by_leader: dict[int, list[Outgoing]] = defaultdict(list)
        for out in batches:
            by_leader[out.leader].append(out)
        for leader, group in by_leader.items():
            durable = [b for b in group if b.topic in self.durable_topics] if self.durable_topics else []
            if len(durable) < len(group):
                ordinary = [b for b in group if b.topic not in self.durable_topics] if durable else group
                self._send_to(leader, self._plans(ordinary), self.acks)
            if durable:
                self._send_to(leader, self._plans(durable), Acks.FLUSHED)

    def _requests(self, batches: list[Outgoing], acks: int) -> list[_Request]:
        """Every request, encoded now (the tests' view of `_plans` and `_request`)."""
        return [self._request(plan, acks, []) for plan in self._plans(batches)]

    @staticmethod
    def _plans(batches: list[Outgoing]) -> list[list[Outgoing]]:
        """The batches of each request, in the order written. Round k holds the k-th
        batch of every partition, so one request never has two batches of a partition
        and their order on the broker is kept."""
        queues: dict[tuple[str, int], deque[Outgoing]] = defaultdict(deque)
        for out in batches:
            queues[(out.topic, out.partition)].append(out)
        if len(queues) == 1:  # one partition: a PRODUCE per batch, in order (batch 1's path)
            return [[out] for out in batches]
        plans = []
        while queues:
            plans.append([q.popleft() for q in queues.values()])
            queues = {k: q for k, q in queues.items() if q}
        return plans

    def _request(self, plan: list[Outgoing], acks: int, outcomes: list[Outcome]) -> _Request | None:
        """A PRODUCE of one batch, a MULTIPRODUCE of several, their sets encoded now. A
        batch whose encoding raises (a bug) gets the exception as its outcome and is left
        out; None when no batch is left."""
        if len(plan) == 1:
            try:
                return self._produce(plan[0], acks)
            except Exception as exc:
                outcomes.append(_new_outcome((plan[0].batch, -1, exc)))
                return None
        parts, included = [], []
        for out in plan:
            try:
                parts.append(ProducePart(out.topic, out.partition, self._payload(out)))
                included.append(out)
            except Exception as exc:
                outcomes.append(_new_outcome((out.batch, -1, exc)))
        if not parts:
            return None
        body = MultiProduceRequest(acks, self.timeout_ms, parts).encode()
        return _Request(included, body, _MULTIPRODUCE, len(body))

    def _payload(self, out: Outgoing) -> bytes:
        return out.payload if out.payload is not None else self._encode(out.batch)

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
        head, payload = self._heads.get((out.topic, out.partition, acks)) or self._head(out, acks), self._payload(out)
        return _new_request(([out], (head, _SIZE.pack(len(payload)), payload), _PRODUCE, len(head) + 4 + len(payload)))

    def _send_to(self, leader: int, plans: list[list[Outgoing]], acks: int) -> None:
        outcomes = self._outcomes  # `answers` returns them
        earlier = [u for u in self._unanswered if u[0] == leader]
        for unanswered in earlier:  # answers on one connection come in order: read the earlier ones first
            self._unanswered.remove(unanswered)
            self._read(*unanswered, 0)
        try:
            conn = self.pool.get(leader)
        except (ConnectionError, OSError) as exc:
            self._fail([out for plan in plans for out in plan], ConnectionError(str(exc)), outcomes)
            return
        expects = acks != _NO_ACKS
        waiting: deque[_Request] = deque()
        pending = deque(plans)
        group: list[_Request] = []
        try:
            while pending:
                # Encode and write as many requests as the window allows, about
                # WRITE_BYTES in one syscall, then read answers until the window is half empty.
                room = self.max_in_flight - len(waiting) if expects else len(pending)
                group, size = [], 0
                while pending and len(group) < room and size < WRITE_BYTES:
                    request = self._request(pending.popleft(), acks, outcomes)
                    if request is not None:
                        group.append(request)
                        size += request.size
                if group:
                    conn.send_many([(r.api, r.body, r.size) for r in group], expects_response=expects)
                    if expects:
                        waiting.extend(group)
                    else:  # acks=0: written is all the broker will ever say
                        outcomes.extend(_new_outcome((b.batch, -1, None)) for r in group for b in r.parts)
                    group = []
                if pending and (error := self._read(leader, conn, waiting, self.max_in_flight // 2)):
                    self._fail([out for plan in pending for out in plan], error, outcomes)
                    return
        except (ConnectionError, OSError) as exc:
            self.pool.drop(leader)
            unanswered = [out for r in (*waiting, *group) for out in r.parts] + [out for plan in pending for out in plan]
            self._fail(unanswered, ConnectionError(str(exc)), outcomes)
            return
        if waiting:
            self._unanswered.append((leader, conn, waiting))

    def _read(self, leader: int, conn: BrokerConnection, waiting: deque[_Request], low: int) -> ConnectionError | None:
        """Read answers until `low` requests wait; a failed connection fails the rest
        and is the error returned. So does an answer that does not decode as its
        request's: the connection's answers no longer match its requests."""
        try:
            while len(waiting) > low:
                error_code, reader = conn.receive()
                self._outcomes.extend(self._answer(waiting[0], error_code, reader))
                waiting.popleft()  # popped after: a failed read fails it
        except (ConnectionError, OSError, LogbusError) as exc:  # LogbusError: InvalidRequest, decoding
            self.pool.drop(leader)
            error = ConnectionError(str(exc) if not isinstance(exc, LogbusError) else
                                    f"an answer did not decode as its request's ({exc}); connection dropped")
            self._fail([out for r in waiting for out in r.parts], error, self._outcomes)
            return error
        return None

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
    def _fail(batches: list[Outgoing], error: BaseException, outcomes: list[Outcome]) -> None:
        outcomes.extend(Outcome(b.batch, -1, error) for b in batches)
