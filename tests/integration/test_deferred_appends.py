"""Small acks=0 sets held to the end of their socket read and appended as one set per log
(`broker.server.deferred`). A real `Broker` (real ZooKeeper, logs on disk) and a real
`Connection` run in this process and are fed frames the way the event loop feeds a socket
read, so which requests share a read is certain rather than up to TCP."""

from __future__ import annotations

import asyncio
import logging
import struct
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import pytest

from broker.common.encoding import encode_message_set
from broker.common.errors import NotLeaderForPartition
from broker.common.message import iter_messages
from broker.common.protocol import (
    ApiKey, MultiProduceRequest, ProducePart, ProduceRequest, Reader, encode_request,
)
from broker.server.deferred import HOLD_MAX_BYTES, HOLD_SET_BYTES
from harness.frames import read_frame
from harness.inprocess import FedBroker, create_topic, feed
from harness.inprocess import fed_broker as serving

TOPIC = "held"


class Fed:
    """The in-process broker (`harness.inprocess`), its connection and the client's end."""

    def __init__(self, fed: FedBroker) -> None:
        self.broker, self.conn, self.peer = fed

    def read(self, stream: bytes) -> None:
        """`stream` in reads as large as the connection offers (one, for the short ones here)."""
        feed(self.conn, stream, len(stream))

    def log(self, partition: int):
        return self.broker.handler.logs.get(TOPIC, partition)

    def stored(self, partition: int) -> bytes:
        """The partition's bytes on disk, every segment in order."""
        log = self.log(partition)
        log.write_unwritten()
        return b"".join(segment.path.read_bytes() for segment in log.segments)

    def answer(self) -> tuple[int, Reader]:
        """The next answer's correlation id and a reader at its body (after the error code)."""
        self.peer.settimeout(10)
        frame = read_frame(self.peer)
        correlation_id, error = struct.unpack_from(">ih", frame)
        assert error == 0, f"request {correlation_id} failed with error code {error}"
        return correlation_id, Reader(frame, 6)


@asynccontextmanager
async def fed_broker(zk_connect: str, workdir: Path, partitions: int = 2,
                     settings: dict[str, str] | None = None) -> AsyncIterator[Fed]:
    async with serving(zk_connect, workdir, {"num.partitions": str(partitions), **(settings or {})}) as fed:
        await create_topic(fed.broker, TOPIC, partitions)
        yield Fed(fed)


def produce(partition: int, message_set: bytes, acks: int = 0, correlation_id: int = 0) -> bytes:
    return encode_request(ApiKey.PRODUCE, correlation_id, "test",
                          ProduceRequest(acks, 1000, TOPIC, partition, message_set).encode())


def a_set(partition: int, n: int, codec: str | None = None) -> bytes:
    """A set of a few values naming their partition and number; `codec` compresses them."""
    values = [(None, f"p{partition}-m{n}-{i}".encode() * (1 + n % 3), 1_700_000_000_000 + n) for i in range(1 + n % 3)]
    return encode_message_set(values, codec) if codec else encode_message_set(values)


def test_sets_sharing_a_read_are_stored_byte_for_byte_as_appends_one_by_one(zk_connect, tmp_path):
    """300 small sets to two partitions, interleaved, some gzip-compressed, in reads that
    each hold many (and segments of 8 KiB, so held appends roll them): each partition
    holds exactly its sets in order, its records are counted, and a record in the middle
    of a held append is found (the entry index)."""
    sent: dict[int, list[bytes]] = {0: [], 1: []}
    stream = b""
    for n in range(300):
        partition = n % 2
        message_set = a_set(partition, n, "gzip" if n % 7 == 0 else None)
        sent[partition].append(message_set)
        stream += produce(partition, message_set)

    async def run() -> None:
        async with fed_broker(zk_connect, tmp_path, settings={"log.segment.bytes": "8192"}) as fed:
            feed(fed.conn, stream, 20_000)  # reads ending mid-frame too
            for partition, sets in sent.items():
                log = fed.log(partition)
                assert fed.stored(partition) == b"".join(sets)
                assert len(log.segments) > 1, "the segments rolled"
                log.flush()
                messages = list(iter_messages(fed.stored(partition), 0))
                assert log.record_count(0)[0] == len(messages)
                middle = messages[len(messages) // 2]
                set_offset, _ = log.read_covering(middle.offset, 1 << 20)
                assert set_offset <= middle.offset
                starts, position = set(), 0
                for message_set in sets:
                    starts.add(position)
                    position += len(message_set)
                assert set_offset in starts, "the read starts at the set holding the record"

    asyncio.run(run())


def test_an_acknowledged_produce_in_the_same_read_comes_after_the_held_sets(zk_connect, tmp_path):
    """acks=0 sets, then an acks=1 PRODUCE to the same partition, in one read: its base
    offset is after them; again after more acks=0 sets, one of them through MULTIPRODUCE
    and one to the other partition. Had the held sets waited for the read's end, the
    acknowledged sets would have been stored first, at offsets 0 and after the first."""
    first = [a_set(0, n) for n in range(5)]
    then = [a_set(0, n) for n in range(5, 8)]
    multi = encode_request(ApiKey.MULTIPRODUCE, 0, "test",
                           MultiProduceRequest(0, 1000, [ProducePart(TOPIC, 0, a_set(0, 8))]).encode())
    acknowledged = [a_set(0, 98), a_set(0, 99)]
    stream = (b"".join(produce(0, s) for s in first) + produce(0, acknowledged[0], acks=1, correlation_id=1)
              + b"".join(produce(0, s) for s in then) + produce(1, a_set(1, 1)) + multi
              + produce(0, acknowledged[1], acks=1, correlation_id=2))

    async def run() -> None:
        async with fed_broker(zk_connect, tmp_path) as fed:
            fed.read(stream)
            assert [fed.answer()[1].int64() for _ in range(2)] == [
                sum(map(len, first)), sum(map(len, [*first, acknowledged[0], *then, a_set(0, 8)]))]
            assert fed.stored(0) == b"".join([*first, acknowledged[0], *then, a_set(0, 8), acknowledged[1]])
            assert fed.stored(1) == a_set(1, 1)

    asyncio.run(run())


def test_a_refused_set_among_held_ones_loses_only_itself(zk_connect, tmp_path, caplog):
    """A set with a broken checksum and one to a partition that does not exist, between
    good ones in one read: the good ones are stored in order, the connection stays open."""
    good = [a_set(0, n) for n in range(6)]
    broken = bytearray(a_set(0, 50))
    broken[-1] ^= 0xFF
    stream = (produce(0, good[0]) + produce(0, good[1]) + produce(0, bytes(broken)) + produce(0, good[2])
              + produce(7, good[3]) + produce(0, good[4]) + produce(0, good[5]))

    async def run() -> None:
        async with fed_broker(zk_connect, tmp_path) as fed:
            with caplog.at_level(logging.WARNING):
                fed.read(stream)
            assert fed.stored(0) == b"".join([good[0], good[1], good[2], good[4], good[5]])
            assert not fed.conn.transport.is_closing()

    asyncio.run(run())
    refused = [r.getMessage() for r in caplog.records if "acks=0" in r.getMessage() or "refused" in r.getMessage()]
    assert len(refused) == 2, refused


def test_held_sets_are_appended_at_the_next_turn_when_a_read_ends_without_it(zk_connect, tmp_path):
    """A request dispatched outside a read (no `write_unwritten` after it) is held, and
    the event loop's next turn appends it."""
    message_set = a_set(0, 1)

    async def run() -> None:
        async with fed_broker(zk_connect, tmp_path) as fed:
            fed.conn._dispatch(produce(0, message_set)[4:])
            assert fed.log(0).end_offset == 0, "held, not yet appended"
            await asyncio.sleep(0)
            assert fed.stored(0) == message_set

    asyncio.run(run())


def test_larger_sets_are_appended_at_once_and_held_ones_before_they_grow_long(zk_connect, tmp_path):
    """A set over HOLD_SET_BYTES is not held; a log's held sets are appended before
    they would pass HOLD_MAX_BYTES (the index would walk a longer set)."""
    large = encode_message_set([(None, b"x" * HOLD_SET_BYTES, 1)])
    small = a_set(0, 2)
    to_fill = HOLD_MAX_BYTES // len(small) + 1

    async def run() -> None:
        async with fed_broker(zk_connect, tmp_path) as fed:
            fed.conn._dispatch(produce(1, large)[4:])
            assert fed.log(1).end_offset == len(large), "appended at once"
            for _ in range(to_fill):
                fed.conn._dispatch(produce(0, small)[4:])
            assert 0 < fed.log(0).end_offset <= HOLD_MAX_BYTES, "the first sets appended before they grew long"
            await asyncio.sleep(0)
            assert fed.stored(0) == small * to_fill

    asyncio.run(run())


def test_held_sets_of_a_partition_no_longer_led_are_dropped_and_the_others_appended(zk_connect, tmp_path, caplog,
                                                                                     monkeypatch):
    """Between the hold and the append (the next turn's, say) this broker stopped leading
    partition 0 — injected: `led` refuses it. Its sets are not appended to what is no
    longer its log, the refusal is logged, and partition 1's sets are still appended."""
    async def run() -> None:
        async with fed_broker(zk_connect, tmp_path) as fed:
            fed.conn._dispatch(produce(0, a_set(0, 1))[4:])
            fed.conn._dispatch(produce(1, a_set(1, 2))[4:])
            handler = fed.broker.handler
            led = handler.led

            def moved(topic: str, partition: int):
                if partition == 0:
                    raise NotLeaderForPartition(f"partition {topic}-0 is led by broker 1")
                return led(topic, partition)

            monkeypatch.setattr(handler, "led", moved)
            with caplog.at_level(logging.WARNING):
                handler.write_unwritten()
            monkeypatch.undo()
            assert fed.log(0).end_offset == 0
            assert fed.stored(1) == a_set(1, 2)

    asyncio.run(run())
    assert any("not appended" in r.getMessage() and "led by broker 1" in r.getMessage() for r in caplog.records)


@pytest.fixture(autouse=True)
def _quiet_broker_stop(caplog):
    """The broker's stop logs its lost ZooKeeper session; the tests read warnings only."""
    caplog.set_level(logging.WARNING)
