"""A partition of every kind of entry, and what a reader must be answered at every
offset of it (docs/architecture.md, "Offsets"): FETCH version 1 and RECORD_COUNT
checked against the records read once from the start."""

from __future__ import annotations

import bisect

from broker.client.connection import BrokerConnection
from broker.common.columns import decode_fetched
from broker.common.message import BatchIdentity, Codec, Message, encode_batch, encode_message_set


def produce_mix(conn: BrokerConnection, topic: str, rounds: int = 3, partition: int = 0) -> None:
    """Per round: a plain entry, an idempotent batch, a gzip set, a zstd batch, a set of
    three plain entries, and entries whose values are encoded entries (a reader taking
    any plausible header for an entry start is fooled by them)."""
    producer_id = conn.init_producer_id().producer_id
    sequence = 0
    for r in range(rounds):
        fake = encode_message_set([(None, b"I look like an entry %d" % r, 7)])
        sets = [
            encode_message_set([(None, b"plain-%d" % r, 1)]),
            encode_batch([(None, b"batch-%d-%d" % (r, i), 2) for i in range(5)], BatchIdentity(producer_id, 0, sequence, 5)),
            encode_message_set([(None, b"gzip-%d-%d" % (r, i), 3) for i in range(4)], Codec.GZIP),
            encode_batch([(None, b"zstd-%d-%d" % (r, i), 4) for i in range(6)], BatchIdentity(producer_id, 0, sequence + 5, 6),
                         Codec.ZSTD),
            encode_message_set([(b"k", b"several-%d-%d" % (r, i), 5) for i in range(3)]),
            encode_message_set([(None, fake * 3, 6)]),
            encode_batch([(None, fake, 6), (None, fake + fake, 6)], BatchIdentity(producer_id, 0, sequence + 11, 2)),
        ]
        sequence += 13
        for data in sets:
            conn.produce(topic, partition, data, acks=-1)


def every_record(conn: BrokerConnection, topic: str, partition: int = 0) -> list[Message]:
    """The partition's visible records, read from its start at entry boundaries."""
    records: list[Message] = []
    offset = conn.offsets(topic, partition, -2)[0]
    while True:
        response = conn.fetch(topic, partition, offset, 1 << 16)
        batch = decode_fetched(response.messages, response.set_offset, offset).messages()
        if not batch:
            return records
        records += batch
        offset = batch[-1].next_offset


def check_every_offset(conn: BrokerConnection, topic: str, records: list[Message], partition: int = 0,
                       pairs: int = 40) -> None:
    """A fetch at every position of the records' range starts at the first record at or
    after it; the count between sampled positions is the records between them."""
    offsets = [m.offset for m in records]
    first, end = offsets[0], records[-1].next_offset
    for position in range(first, end):
        response = conn.fetch(topic, partition, position, 4096)
        got = decode_fetched(response.messages, response.set_offset, position).messages()
        following = records[bisect.bisect_left(offsets, position):][:1]
        assert [(m.offset, m.value) for m in got[:1]] == [(m.offset, m.value) for m in following], f"fetch at {position}"
    step = max(1, (end - first) // pairs)
    sampled = list(range(first, end + 1, step)) + [end]
    for i, start in enumerate(sampled):
        for stop in sampled[i:]:
            want = bisect.bisect_left(offsets, stop) - bisect.bisect_left(offsets, start)
            assert conn.record_count(topic, partition, start, stop).records == want, f"records in [{start}, {stop})"
