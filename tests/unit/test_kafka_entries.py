"""Magic-4 entries (a Kafka RecordBatch v2 stored verbatim, docs/kafka.md "Record
batches") as ordinary logbus data: appended by `Log.append_kafka`, counted by the entry
index, read by `iter_messages`, `decode_columns` and `decode_fetched`, checked by
`scan` (a follower's append, recovery), their producer state learnt on a follower and
rebuilt after a crash, refused to a native PRODUCE. Batches come from the real clients:
kafka-python's builder and librdkafka's bytes (tests/unit/kafka_capture.py)."""

from __future__ import annotations

import os
import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker.common.columns import decode_columns, decode_fetched
from broker.common.errors import InvalidMessage
from broker.common.kafka.records import ATTRIBUTES_AT, CODEC_BITS, check_batch, entry_batch, kafka_entry
from broker.common.message import (
    HEADER, MAGIC_KAFKA, CorruptEntry, ScanStop, encode_message_set, iter_messages, scan, validate_message_set,
)
from broker.common.records import count_records
from broker.server.log.log import Log, LogConfig
from tests.unit.test_kafka_records import PRODUCER_ID, librdkafka_batch

CODECS = {"none": 0, "gzip": 1, "lz4": 3, "zstd": 4}


def kafka_batch(n: int = 5, producer_id: int = 5, base_sequence: int = 0, codec: int = 0, value: bytes = b"v%d",
                timestamp: int = 1_700_000_000_000) -> bytes:
    """A batch as kafka-python builds it: record i has key k<i>, value `value % i` (or
    none when `value` is None) and one header."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=0, producer_id=producer_id,
                                        producer_epoch=0 if producer_id >= 0 else -1,
                                        base_sequence=base_sequence if producer_id >= 0 else -1, batch_size=1 << 30)
    for i in range(n):
        builder.append(i, timestamp=timestamp + i, key=b"k%d" % i, value=None if value is None else value % i
                       if b"%" in value else value, headers=[("h", b"%d" % i)])
    return bytes(builder.build())


def native(log: Log, values: list[bytes]):
    data = encode_message_set([(None, v, 1000 + i) for i, v in enumerate(values)])
    result = scan(data)
    return log.append(data, result.count, result.min_timestamp, result.max_timestamp)


def whole(log: Log) -> bytes:
    log.flush()
    return log.read(log.start_offset, 1 << 30).read()


@pytest.fixture
def make_log(tmp_path):
    def make(name: str = "events-0", **config) -> Log:
        return Log(tmp_path / name, "events", 0, LogConfig(**config))

    return make


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_librdkafka_batch_appended_reads_back_through_every_reader(make_log, codec: str) -> None:
    log = make_log()
    native(log, [b"before"])
    batch, _ = librdkafka_batch(codec)
    appended = log.append_kafka(batch, check_batch(batch), 3)
    native(log, [b"after"])
    data = whole(log)
    position = appended.base_offset
    assert not appended.duplicate and position == len(encode_message_set([(None, b"before", 1000)]))
    messages = list(iter_messages(data, 0))
    assert [m.offset for m in messages] == [0, *range(position, position + 50), appended.next_offset]
    inner = messages[1:51]
    assert [m.next_offset for m in inner] == [*range(position + 1, position + 50), appended.next_offset]
    assert inner[3].key == b"k3" and inner[3].value == b"value-3" * 20 and inner[3].headers == (("h", b"3"),)
    assert inner[3].timestamp == 1_700_000_000_003
    assert messages[0].headers == () and messages[-1].value == b"after"
    stored = entry_batch(data, position)
    assert struct.unpack_from(">qii", stored, 0)[0::2] == (position, 3)  # baseOffset = P, partitionLeaderEpoch
    # the columns reader, and a fetch inside the batch, agree with the reference
    assert decode_columns(data, 0).messages() == messages
    assert decode_fetched(data, 0, position + 10).messages() == messages[11:]
    columns = decode_columns(data, 0)
    assert columns.corrupt is None and columns.values()[1] == b"value-0" * 20
    # the index counts the batch's records, so a fetch at a record inside it finds its start
    assert log.record_count(0, log.end_offset)[0] == 52
    assert log.record_count(position + 7, log.end_offset)[0] == 44
    assert log.record_count(appended.next_offset, log.end_offset)[0] == 1  # a walk over the entry counts 50
    assert log.read_covering(position + 7, 1 << 20)[0] == position
    assert count_records(data) == 52


def test_a_retried_idempotent_batch_is_a_duplicate_and_stays_one_after_a_crash(make_log) -> None:
    log = make_log()
    first, second = kafka_batch(5), kafka_batch(3, base_sequence=5)
    appended = log.append_kafka(first, check_batch(first), 0)
    end = log.end_offset
    retry = log.append_kafka(first, check_batch(first), 0)
    assert retry.duplicate and (retry.base_offset, retry.next_offset) == (appended.base_offset, appended.next_offset)
    assert log.end_offset == end
    # kill -9: no close, so no producer snapshot; recovery rebuilds the state from the entries
    assert not log.producer_snapshots
    reopened = Log(log.directory, "events", 0, log.config, recover=True)
    retry = reopened.append_kafka(first, check_batch(first), 0)
    assert retry.duplicate and retry.base_offset == appended.base_offset and reopened.end_offset == end
    assert reopened.record_count(0, end)[0] == 5  # the index rebuilt by recovery's scan counts recordsCount
    assert not reopened.append_kafka(second, check_batch(second), 0).duplicate  # the next sequence goes on


def test_batches_without_a_producer_id_are_never_duplicates(make_log) -> None:
    log = make_log()
    batch = kafka_batch(2, producer_id=-1)
    produced = check_batch(batch)
    assert produced.identity is None
    offsets = {log.append_kafka(batch, produced, 0).base_offset for _ in range(2)}
    assert len(offsets) == 2
    assert len(list(iter_messages(whole(log), 0))) == 4


def test_a_follower_appends_the_leaders_bytes_and_learns_its_producer_state(make_log) -> None:
    leader, follower = make_log("leader-0"), make_log("follower-0")
    native(leader, [b"a", b"b"])
    batch, _ = librdkafka_batch("gzip", 20)
    held = leader.append_kafka(batch, check_batch(batch), 2)
    data = whole(leader)
    follower.append_replica(data)
    assert whole(follower) == data
    retry = follower.append_kafka(batch, check_batch(batch), 2)  # the follower became the leader
    assert retry.duplicate and retry.base_offset == held.base_offset
    assert check_batch(batch).identity.producer_id == PRODUCER_ID
    assert follower.record_count(0, follower.end_offset)[0] == 22


def test_recovery_cuts_a_torn_kafka_entry(make_log) -> None:
    log = make_log()
    first, torn = kafka_batch(4), kafka_batch(6, base_sequence=4)
    log.append_kafka(first, check_batch(first), 0)
    cut_at = log.end_offset
    log.append_kafka(torn, check_batch(torn), 0)
    (segment,) = log.directory.glob("*.kafka")
    os.truncate(segment, cut_at + 40)  # the second entry's header and part of its batch
    reopened = Log(log.directory, "events", 0, log.config, recover=True)
    assert reopened.end_offset == cut_at
    assert [m.offset for m in iter_messages(whole(reopened), 0)] == [0, 1, 2, 3]
    again = reopened.append_kafka(torn, check_batch(torn), 0)  # not held: the crash lost it
    assert not again.duplicate and again.base_offset == cut_at


def _with_crc(entry: bytearray) -> bytes:
    """`entry` with its logbus CRC fixed: malformed by a writer, not damaged after."""
    from broker.common.message import V4_SEEDS, checksum

    struct.pack_into(">I", entry, 6, checksum(memoryview(entry)[10:], V4_SEEDS[0]))
    return bytes(entry)


def test_a_damaged_kafka_entry_is_refused_with_its_reason(make_log) -> None:
    entry = kafka_entry(kafka_batch(5), 0, 0, 1)
    assert scan(entry).stop is ScanStop.END and scan(entry).batches == 1
    for at in (HEADER.size + 3, len(entry) - 1):  # baseOffset (not under Kafka's own CRC), a record's byte
        damaged = bytearray(entry)
        damaged[at] ^= 1
        result = scan(damaged)
        assert (result.stop, result.error, result.valid_bytes) == (ScanStop.INVALID, "CRC mismatch at byte 0", 0)
        with pytest.raises(InvalidMessage, match="CRC mismatch"):
            make_log(f"follower-{at}").append_replica(bytes(damaged))
        with pytest.raises(CorruptEntry, match="CRC mismatch"):
            list(iter_messages(damaged, 0))
        assert decode_columns(damaged, 0).corrupt.reason == "CRC mismatch"
    wrong_length = bytearray(entry)
    struct.pack_into(">i", wrong_length, HEADER.size + 8, len(entry))  # batchLength past the entry
    result = scan(_with_crc(wrong_length))
    assert result.stop is ScanStop.INVALID and "batchLength" in result.error
    with pytest.raises(CorruptEntry, match="batchLength"):
        list(iter_messages(_with_crc(wrong_length), 0))
    keyed = bytearray(entry)
    struct.pack_into(">i", keyed, 18, 0)  # key_length 0
    assert "has attributes, a key" in scan(_with_crc(keyed)).error


def test_a_native_produce_cannot_send_magic_4() -> None:
    entry = kafka_entry(kafka_batch(5), 0, 0, 1)
    assert entry[4] == MAGIC_KAFKA
    with pytest.raises(InvalidMessage, match="magic 4 at byte 0: a Kafka record batch is written only by the broker"):
        validate_message_set(entry, 1 << 20)
    plain = encode_message_set([(None, b"x", 1)])
    with pytest.raises(InvalidMessage, match=f"magic 4 at byte {len(plain)}"):
        validate_message_set(plain + entry, 1 << 20)


def test_a_batch_compressed_below_its_record_count_is_stored_uncompressed_and_valid(make_log) -> None:
    log = make_log()
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=CODECS["zstd"], is_transactional=0, producer_id=5,
                                        producer_epoch=0, base_sequence=0, batch_size=1 << 30)
    for i in range(2048):  # identical empty records: zstd packs them into fewer bytes than records
        builder.append(i, timestamp=1, key=None, value=b"", headers=[])
    batch = bytes(builder.build())
    produced = check_batch(batch)
    assert produced.store_decompressed and len(batch) + HEADER.size < 2048
    appended = log.append_kafka(batch, produced, 0)
    assert appended.next_offset - appended.base_offset >= 2048  # an offset for each record
    stored = bytes(entry_batch(whole(log), appended.base_offset))
    assert struct.unpack_from(">h", stored, ATTRIBUTES_AT)[0] & CODEC_BITS == 0
    assert check_batch(stored).records == 2048  # its CRC and batchLength hold
    reader = KafkaPythonBatch(stored)
    assert reader.validate_crc() and [r.offset for r in reader][-1] == appended.base_offset + 2047
    messages = list(iter_messages(whole(log), 0))
    assert len(messages) == 2048 and messages[-1].offset == 2047 and messages[5].value == b""


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_compressed_batches_of_the_python_client_read_back(make_log, codec: str) -> None:
    log = make_log()
    batch = kafka_batch(30, codec=CODECS[codec], value=b"record-%d-" + b"x" * 100)
    assert struct.unpack_from(">h", batch, ATTRIBUTES_AT)[0] & CODEC_BITS == CODECS[codec]
    appended = log.append_kafka(batch, check_batch(batch), 0)
    stored = entry_batch(whole(log), appended.base_offset)
    assert bytes(stored[ATTRIBUTES_AT:]) == batch[ATTRIBUTES_AT:]  # kept compressed, verbatim
    messages = decode_columns(whole(log), 0).messages()
    assert [m.value[:9] for m in messages[:2]] == [b"record-0-", b"record-1-"]
    assert [m.offset for m in messages] == list(range(30)) and messages[29].headers == (("h", b"29"),)


def test_a_null_value_reads_as_empty_bytes(make_log) -> None:
    log = make_log()
    batch = kafka_batch(2, value=None)
    log.append_kafka(batch, check_batch(batch), 0)
    assert [(m.key, m.value) for m in iter_messages(whole(log), 0)] == [(b"k0", b""), (b"k1", b"")]
    assert decode_columns(whole(log), 0).values() == [b"", b""]
