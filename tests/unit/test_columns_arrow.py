"""The Arrow `headers` column (`broker/common/columns_arrow.py`): a Kafka record's
headers as Spark's Kafka source has them — `array<struct<key: string, value: binary>>`,
a null header value kept null, an empty list for a message without headers (not
Spark's null: pyiceberg reads a null list as empty, columns_arrow.py says why) — in
message order beside native messages, through a fetch that starts inside a batch."""

from __future__ import annotations

import pyarrow as pa
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker.common.columns import decode_fetched
from broker.common.columns_arrow import COLUMNS, decode_arrow, headers_type
from broker.common.kafka.records import check_batch
from broker.common.message import iter_messages
from tests.unit.test_kafka_entries import kafka_batch, make_log, native, whole  # noqa: F401 (a fixture)

HEADERS = [[], [("trace", b"abc"), ("null", None), ("empty", b"")], [("h", b"\x00\xff")], [], [("dup", b"1"),
                                                                                              ("dup", b"2")]]


def mixed_batch(codec: int = 0) -> bytes:
    """Five records as kafka-python builds them: none, three (one null, one empty
    value), one binary, none, a key repeated."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for i, headers in enumerate(HEADERS):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=b"v%d" % i, headers=headers)
    return bytes(builder.build())


def expected(headers: list) -> list:
    return [[{"key": k, "value": v} for k, v in h] for h in headers]


@pytest.mark.parametrize("codec", [0, 1])
def test_headers_are_a_column_in_message_order_empty_where_a_message_has_none(make_log, codec: int) -> None:
    log = make_log()
    native(log, [b"before"])
    batch = mixed_batch(codec)
    log.append_kafka(batch, check_batch(batch), 0)
    native(log, [b"after", b"again"])
    data = whole(log)
    arrow = decode_arrow("t", 0, 0, data)
    assert arrow.schema.names == COLUMNS and arrow.schema.field("headers").type == headers_type()
    assert arrow.schema.names[-1] == "value"  # the data source's JSON parse goes after it
    assert arrow.column("headers").to_pylist() == [[], *expected(HEADERS), [], []]
    assert arrow.column("value").to_pylist() == [b"before", *[b"v%d" % i for i in range(5)], b"after", b"again"]
    reference = [[{"key": k, "value": v} for k, v in m.headers] for m in iter_messages(data, 0)]
    assert arrow.column("headers").to_pylist() == reference


def test_a_fetch_starting_inside_a_batch_keeps_each_records_headers(make_log) -> None:
    log = make_log()
    batch = mixed_batch()
    appended = log.append_kafka(batch, check_batch(batch), 0)
    native(log, [b"after"])
    columns = decode_fetched(whole(log), 0, appended.base_offset + 2)
    assert columns.to_arrow("t", 0).column("headers").to_pylist() == [*expected(HEADERS[2:]), []]


def test_native_messages_only_have_empty_headers_of_the_same_type(make_log) -> None:
    log = make_log()
    native(log, [b"a", b"b"])
    column = decode_arrow("t", 0, 0, whole(log)).column("headers")
    assert column.type == headers_type() and column.null_count == 0 and column.to_pylist() == [[], []]


def test_a_batch_where_every_record_has_headers(make_log) -> None:
    log = make_log()
    batch = kafka_batch(n=4)  # one header a record: ("h", b"<i>")
    log.append_kafka(batch, check_batch(batch), 0)
    column = decode_arrow("t", 0, 0, whole(log)).column("headers")
    assert column.to_pylist() == [[{"key": "h", "value": b"%d" % i}] for i in range(4)]
    assert pa.types.is_list(column.type) and column.type.value_type.field("value").nullable
