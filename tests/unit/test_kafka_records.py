"""Kafka record batches (broker.common.kafka.records, .fetch) against the real clients'
bytes: librdkafka's (confluent-kafka, captured from a socket), aiokafka's and
kafka-python's builders; the broker's refusals each with its reason."""

from __future__ import annotations

import struct

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AiokafkaBuilder
from confluent_kafka import Producer
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder

from broker.common.compression import Codec
from broker.common.kafka import frames
from broker.common.kafka.fetch import fetch_batches, native_batch, read_records
from broker.common.kafka.records import (
    ATTRIBUTES_AT, MAGIC_KAFKA_BATCH, BatchRefused, check_batch, entry_batch, kafka_entry,
)
from broker.common.message import BatchIdentity, MIN_ENTRY_SIZE, HEADER, checksum, encode_batch, encode_message_set
from tests.unit.kafka_capture import PRODUCER_ID, CaptureBroker

CODECS = {"none": Codec.NONE, "gzip": Codec.GZIP, "lz4": Codec.LZ4, "zstd": Codec.ZSTD}


def librdkafka_batch(codec: str, n: int = 50) -> tuple[bytes, int]:
    """The record batch librdkafka's idempotent producer sends (and the Produce version)."""
    broker = CaptureBroker()
    try:
        producer = Producer({"bootstrap.servers": broker.address, "enable.idempotence": True, "acks": "all",
                             "compression.type": codec, "linger.ms": 100})
        for i in range(n):
            producer.produce("t", value=b"value-%d" % i * 20, key=b"k%d" % i, headers=[("h", b"%d" % i)],
                             timestamp=1_700_000_000_000 + i)
        assert producer.flush(30) == 0
        header, request = frames.decode_request(broker.requests(0)[0])
        return bytes(request.topic_data[0].partition_data[0].records), header.api_version
    finally:
        broker.close()


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_librdkafka_batch_is_checked_stored_and_read_back_with_its_headers(codec: str) -> None:
    batch, version = librdkafka_batch(codec)
    assert version >= 3
    produced = check_batch(batch)
    assert produced.records == 50 and produced.codec is CODECS[codec] and not produced.store_decompressed
    assert produced.identity == BatchIdentity(PRODUCER_ID, 0, 0, 50)
    entry = kafka_entry(batch, 4096, 7, produced.max_timestamp)
    assert HEADER.unpack_from(entry, 0)[1] == MAGIC_KAFKA_BATCH
    stored = entry_batch(entry)
    assert struct.unpack_from(">qii", stored, 0)[0::2] == (4096, 7)  # baseOffset = P, partitionLeaderEpoch
    assert bytes(stored[ATTRIBUTES_AT:]) == batch[ATTRIBUTES_AT:]  # verbatim: the client's CRC still holds
    check_batch(stored)
    records = read_records(stored)
    assert [r.offset for r in records] == list(range(4096, 4146))
    assert records[3].key == b"k3" and records[3].value == b"value-3" * 20 and records[3].headers == [("h", b"3")]
    assert records[3].timestamp == 1_700_000_000_003
    # a real client reads what a Kafka fetch would send
    assert [r.offset for r in KafkaPythonBatch(bytes(stored))][-1] == 4145


@pytest.mark.parametrize("builder", [AiokafkaBuilder, KafkaPythonBuilder])
def test_python_clients_batches_are_accepted(builder: type) -> None:
    b = builder(magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1,
                base_sequence=-1, batch_size=1 << 20)
    for i in range(10):
        b.append(i, timestamp=1_700_000_000_000, key=None, value=b"x" * 200, headers=[("a", None)])
    produced = check_batch(bytes(b.build()))
    assert produced.records == 10 and produced.identity is None


def _recrc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, checksum(memoryview(batch)[ATTRIBUTES_AT:]))
    return bytes(batch)


def _aiokafka(n: int, gap_at: int = -1) -> bytearray:
    b = AiokafkaBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=5, producer_epoch=0,
                        base_sequence=0, batch_size=1 << 20)
    for i in range(n):
        b.append(i + (i >= gap_at >= 0), timestamp=1_700_000_000_000, key=None, value=b"x" * 20, headers=[])
    return b.build()


def test_refusals_name_their_reason() -> None:
    good = bytes(_aiokafka(5))
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 1
    with pytest.raises(BatchRefused, match="CRC mismatch") as refused:
        check_batch(bytes(bad_crc))
    assert refused.value.corrupt
    with pytest.raises(BatchRefused, match="batchLength"):
        check_batch(good[:-3])  # truncated
    with pytest.raises(BatchRefused, match="needs 61 bytes"):
        check_batch(good[:40])
    wrong_count = bytearray(good)
    struct.pack_into(">i", wrong_count, 23, 5)  # lastOffsetDelta 5 ...
    struct.pack_into(">i", wrong_count, 57, 6)  # ... and recordsCount 6, for 5 records
    with pytest.raises(BatchRefused, match="does not decode after 5 records"):
        check_batch(_recrc(wrong_count))
    struct.pack_into(">i", wrong_count, 23, 3)
    struct.pack_into(">i", wrong_count, 57, 4)  # 4 records said, 5 held
    with pytest.raises(BatchRefused, match="after 4 records.*27 unconsumed bytes"):
        check_batch(_recrc(wrong_count))
    gap = _aiokafka(5, gap_at=2)  # deltas 0 1 3 4 5 ...
    struct.pack_into(">i", gap, 23, 4)  # ... under a lastOffsetDelta that agrees with the count
    with pytest.raises(BatchRefused, match="record 2 has offsetDelta 3, not 2"):
        check_batch(_recrc(gap))
    transactional = bytearray(good)
    struct.pack_into(">h", transactional, ATTRIBUTES_AT, 0x10)
    with pytest.raises(BatchRefused, match="no transactions") as refused:
        check_batch(_recrc(transactional))
    assert not refused.value.corrupt
    with pytest.raises(BatchRefused, match="exceeds message.max.bytes=100"):
        check_batch(good, max_bytes=100)
    old_magic = bytearray(good)
    old_magic[16] = 1
    with pytest.raises(BatchRefused, match="magic 1"):
        check_batch(bytes(old_magic))


def test_record_running_past_its_length_is_refused() -> None:
    batch = _aiokafka(3)
    batch[61] += 2  # first record's length varint (zigzag): claims one byte more than it has
    with pytest.raises(BatchRefused, match="does not decode after 0 records"):
        check_batch(_recrc(batch))


def test_native_entries_convert_to_batches_kafka_clients_read_at_their_offsets() -> None:
    plain = encode_message_set([(None, b"a", 1), (b"k", b"b", 2)])
    idempotent = encode_batch([(None, b"v%d" % i, 3) for i in range(50)], BatchIdentity(9, 0, 0, 50), "gzip")
    produced = bytes(_aiokafka(4))
    stored = kafka_entry(produced, 10_000 + len(plain) + len(idempotent), 0, 1_700_000_000_000)
    region = plain + idempotent + stored + plain[:MIN_ENTRY_SIZE]  # a partial entry at the end
    batches = fetch_batches(region, 10_000)
    assert len(batches) == 2 and bytes(batches[1]) == bytes(entry_batch(stored))
    offsets = [r.offset for b in batches for r in KafkaPythonBatch(bytes(b))]
    first_plain = 10_000 + len(plain) // 2
    assert offsets == [10_000, first_plain] + [10_000 + len(plain) + i for i in range(50)] + [
        10_000 + len(plain) + len(idempotent) + i for i in range(4)]
    assert [r.key for r in KafkaPythonBatch(bytes(batches[0]))][:2] == [None, b"k"]
    assert native_batch([(7, 1, None, b"x")])[:8] == struct.pack(">q", 7)
