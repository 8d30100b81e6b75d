"""The idempotent sender reads a round's answers only after it has drained and encoded
the next (issue 38). A scripted pipeline injects the broker's refusals, which a real
broker gives only in races: a partition whose batch failed must not have later batches
written before that batch's retry, and nothing may be lost to a close in between. Late
answers also share their connection with the sender's own requests, which must never
read a produce answer as theirs, and an answer that does not decode leaves nothing pending."""

from __future__ import annotations

import time

import pytest

from broker.client.connection import BrokerConnection
from broker.client.idempotence import ProducerIdentity
from broker.client.pipeline import Outcome, Outgoing, Pipeline
from broker.client.results import ReportBook
from broker.client.sender import Sender
from broker.common.compression import Codec
from broker.common.errors import InvalidRequest, NotLeaderForPartition, OutOfOrderSequence
from broker.common.protocol import ApiKey
from broker.common.protocol.primitives import Reader
from tests.unit.test_accumulator import Leaders, accumulator, drain


class ScriptedPipeline:
    """Takes writes; answers them when asked, with the error scripted for a message."""

    acks = 1

    def __init__(self, errors: dict[bytes, Exception]) -> None:
        self.errors = errors
        self.written: list[list[bytes]] = []
        self.due: list = []

    @property
    def unanswered(self) -> bool:
        return bool(self.due)

    def write(self, batches, encode=None) -> None:
        assert all(out.payload or encode(out.batch) for out in batches)
        self.written.append([value for out in batches for _, value, _ in out.batch.messages()])
        self.due.extend(batches)

    def answers(self) -> list[Outcome]:
        due, self.due = self.due, []
        return [Outcome(out.batch, 0, self.errors.get(next(iter(out.batch.messages()))[1])) for out in due]


class MetadataStub(Leaders):
    def refresh(self, topic: str) -> None:
        pass


def sender_over(acc, pipeline) -> Sender:
    identity = ProducerIdentity()
    identity.start(9)
    return Sender(acc, acc.metadata, None, pipeline, Codec.NONE, ReportBook(), retries=5, retry_backoff=1.0,
                  delivery_timeout=60.0, idempotence=identity)


def values(batches) -> list[bytes]:
    return [value for batch in batches for _, value, _ in batch.messages()]


def test_a_round_encoded_behind_a_failed_batch_waits_for_its_retry_in_order():
    acc = accumulator(MetadataStub(t={0: 7}), batch_size=1, max_in_flight_per_partition=5)
    pipeline = ScriptedPipeline({b"m1": NotLeaderForPartition("moved"), b"m2": OutOfOrderSequence("gap"),
                                 b"m3": OutOfOrderSequence("gap")})
    sender = sender_over(acc, pipeline)
    for i in range(4):
        acc.append("t", None, b"m%d" % i, 1, 0)
    sender._send(drain(acc, 0.0))
    assert pipeline.written == [[b"m0", b"m1", b"m2", b"m3"]] and pipeline.unanswered  # not answered yet
    for i in range(4, 6):
        acc.append("t", None, b"m%d" % i, 1, 0)
    sender._send(drain(acc, 0.0))  # encodes m4, m5; then the answers: m1 failed, m2 and m3 behind it
    assert pipeline.written[-1] == [], "nothing of the partition goes before m1's retry"
    assert values(acc._ready) == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    assert [b.sequence for b in acc._ready] == [1, 2, 3, 4, 5], "one epoch: the gap was m1's, being retried"
    assert [b.attempts for b in acc._ready] == [1, 1, 1, 0, 0]
    assert acc.outstanding == 5  # m0 delivered

    pipeline.errors.clear()
    sender._send(drain(acc, time.monotonic() + 2.0))  # after the backoff, in order, the same sequences
    sender._settle(pipeline.answers())
    assert pipeline.written[-1] == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    assert acc.outstanding == 0 and sender.report.take(0).delivered == 6


def test_a_close_between_a_round_and_its_answers_fails_both_rounds():
    acc = accumulator(MetadataStub(t={0: 7}), batch_size=1, max_in_flight_per_partition=5)
    sender = sender_over(acc, ScriptedPipeline({}))
    acc.append("t", None, b"m0", 1, 0)
    sender._send(drain(acc, 0.0))
    acc.append("t", None, b"m1", 1, 0)
    drain(acc, 0.0)  # drained, not yet written: the sender is encoding it
    assert values(acc.abandon()) == [b"m0", b"m1"]


class DownPool:
    """A pool whose leader cannot be reached."""

    def get(self, broker_id: int):
        raise ConnectionError(f"broker {broker_id} is not live")


def test_a_write_that_fails_at_once_leaves_its_outcomes_due():
    """The sender settles a round late only while the pipeline says something is due: a
    write whose connection failed has outcomes and no answer to read, and must say so
    (else the sender naps and the batches wait forever: the failover tests hung)."""
    pipeline = Pipeline(DownPool(), 1, 1000)
    pipeline.write([Outgoing("b0", "t", 0, 7, b"set")])
    assert pipeline.unanswered
    [outcome] = pipeline.answers()
    assert (outcome.batch, type(outcome.error)) == ("b0", ConnectionError)
    assert not pipeline.unanswered


class OwnRequests:
    """A pool whose one connection records, for each request of the sender's own (a
    topic's creation, a producer id), whether produce answers were still unread on it."""

    def __init__(self, pipeline: ScriptedPipeline, metadata: Leaders) -> None:
        self.pipeline, self.metadata = pipeline, metadata
        self.unread_at_request: list[bool] = []

    def any(self):
        return self

    def create_topic(self, topic: str, partitions: int) -> None:
        self.unread_at_request.append(self.pipeline.unanswered)
        self.metadata.topics[topic] = {0: 7}


def test_the_senders_own_request_waits_for_the_rounds_answers_on_the_connection():
    """A round's answers are read late (after the next round is encoded); a request of
    the sender's own on the same connection in between would take a produce answer
    for its own (seen in CI: a topic created while a MULTIPRODUCE was unanswered, whose
    answer was then read as the creation's, and its batches left pending)."""
    metadata = MetadataStub(t={0: 7})
    acc = accumulator(metadata, batch_size=1, max_in_flight_per_partition=5)
    pipeline = ScriptedPipeline({})
    sender = sender_over(acc, pipeline)
    sender.pool = pool = OwnRequests(pipeline, metadata)
    acc.append("t", None, b"m0", 1, 0)
    sender._send(drain(acc, 0.0))
    assert pipeline.unanswered
    sender._wanted.add("fresh")
    sender._find_topics(time.monotonic())
    assert pool.unread_at_request == [False]
    assert "fresh" in metadata.topics and sender.report.take(0).delivered == 1  # m0 settled first


def test_an_answer_that_does_not_decode_fails_its_round_as_a_lost_connection():
    """Nothing may stay pending on an answer the pipeline cannot decode (the CI run's
    batches waited until close): the connection is dropped and every batch waiting on
    it fails with a retriable ConnectionError."""
    class Garbled:
        def send_many(self, requests, expects_response=True) -> None:
            pass

        def receive(self):
            return 0, Reader(b"\x00\x01")  # a MULTIPRODUCE answer two bytes long

    class OnePool:
        def __init__(self) -> None:
            self.dropped: list[int] = []

        def get(self, broker_id: int):
            return Garbled()

        def drop(self, broker_id: int) -> None:
            self.dropped.append(broker_id)

    pool = OnePool()
    pipeline = Pipeline(pool, 1, 1000)
    pipeline.write([Outgoing("b0", "t", 0, 7, b"set"), Outgoing("b1", "t", 1, 7, b"set")])
    outcomes = pipeline.answers()
    assert [(o.batch, type(o.error)) for o in outcomes] == [("b0", ConnectionError), ("b1", ConnectionError)]
    assert pool.dropped == [7] and not pipeline.unanswered


def test_a_call_is_refused_while_earlier_answers_are_unread():
    """The invariant behind the sender's fix, kept by the connection itself: a call on a
    connection with pipelined answers unread would take the first of them for its own."""
    conn = BrokerConnection("127.0.0.1", 9)  # never connected: the call is refused before it sends
    conn._in_flight.append(41)  # a PRODUCE written with send_many, its answer not read
    with pytest.raises(InvalidRequest, match="1 earlier answers are unread"):
        conn.call(ApiKey.METADATA, b"")
