"""Decoded messages (`broker.common.columns.MessageColumns`) as an Arrow record batch:
what the Spark data source reads with (`decode_arrow`), gathered with numpy in bulk,
never a Python object per message (docs/protocol.md, "Message format").

The columns, `COLUMNS`: topic string, partition int32, offset int64, timestamp UTC in
microseconds as Spark's, key binary or null, `headers`, value binary. `headers` is a
Kafka record's headers (docs/kafka.md) with Spark's Kafka source's type and rule —
`array<struct<key: string, value: binary>>`, a header's value null where the client
sent null (`headers_type`) — but **an empty list for a message without headers**
(every native message, and a Kafka record with none) where Spark's source has null:
pyiceberg reads a null `list<struct>` back as an empty list (apache/iceberg-python
#3833), and the table's compaction rewrites what it reads, so a null would not stay
null; an empty list reads the same through every reader. Only the messages that have
headers cost Python work (one tuple each, already decoded). `value` stays last: the data
source puts its JSON parse after it (`airflow_provider_logbus/spark/datasource.py`).

pyarrow and numpy are imported only when called, so the shared contracts need neither
(tests/unit/test_layers.py, ARROW_DECODER).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.common.errors import InvalidMessage
from broker.common.message import HEADER_SIZE

if TYPE_CHECKING:
    from broker.common.columns import MessageColumns

COLUMNS = ["topic", "partition", "offset", "timestamp", "key", "headers", "value"]


def headers_type():
    """`array<struct<key: string, value: binary>>`, as Spark's Kafka source types `headers`."""
    import pyarrow as pa

    return pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def record_batch(columns: "MessageColumns", topic: str, partition: int):
    """The Arrow record batch (`COLUMNS`) of `columns`, read from `topic`-`partition`."""
    import numpy as np
    import pyarrow as pa

    n = len(columns)
    data = np.frombuffer(columns.data, dtype=np.uint8)
    starts = np.frombuffer(columns.starts, dtype=np.int64)
    key_lengths = np.frombuffer(columns.key_lengths, dtype=np.int32).astype(np.int64)
    has_key = key_lengths >= 0
    key_lengths = np.maximum(key_lengths, 0)
    key_starts = starts + HEADER_SIZE
    value_starts = key_starts + key_lengths
    value_lengths = np.frombuffer(columns.ends, dtype=np.int64) - value_starts
    return pa.RecordBatch.from_arrays(
        [
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([topic]))
            .cast(pa.string()),
            pa.array(np.full(n, partition, dtype=np.int32)),
            pa.array(np.frombuffer(columns.offsets, dtype=np.int64)),
            pa.array(np.frombuffer(columns.timestamps, dtype=np.int64) * 1000, pa.int64())
            .cast(pa.timestamp("us", tz="UTC")),
            _binary_array(pa, np, data, key_starts, key_lengths, has_key),
            _headers_array(pa, np, n, columns.headers),
            _binary_array(pa, np, data, value_starts, value_lengths),
        ],
        names=COLUMNS,
    )


def _headers_array(pa, np, n: int, headers: dict[int, tuple]):
    """The `headers` column of `n` messages, of which those in `headers` (by index) have
    any: list offsets from their counts, one struct array of all their headers."""
    kind = headers_type()
    which = sorted(headers)
    counts = np.zeros(n, dtype=np.int32)
    counts[which] = [len(headers[i]) for i in which]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    pairs = [pair for i in which for pair in headers[i]]
    entries = pa.StructArray.from_arrays([pa.array([k for k, _ in pairs], pa.string()),
                                          pa.array([v for _, v in pairs], pa.binary())], fields=list(kind.value_type))
    return pa.ListArray.from_arrays(pa.array(offsets), entries, type=kind)


def _binary_array(pa, np, data, starts, lengths, valid=None):
    """A BinaryArray of data[starts[i]:starts[i]+lengths[i]]: one mask over the buffer
    (+1 where a value starts, -1 where it ends, summed) selects every value's bytes in
    order, since values never overlap and lie in message order."""
    n = len(starts)
    lengths = np.where(valid, lengths, 0) if valid is not None else lengths
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1]:
        delta = np.zeros(len(data) + 1, dtype=np.int8)
        nonempty = lengths > 0
        delta[starts[nonempty]] += 1
        delta[(starts + lengths)[nonempty]] -= 1
        values = data[np.cumsum(delta[:-1], dtype=np.int8).astype(bool)]
    else:
        values = np.zeros(0, dtype=np.uint8)
    validity = None
    if valid is not None and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(values)])


def decode_arrow(topic: str, partition: int, base: int, buf: bytes, verify_crc: bool = True):
    """One record batch (`COLUMNS`) of a buffer of whole entries at offsets
    base..base+len(buf): the Spark data source's read. Raises InvalidMessage naming
    `topic-partition` and the offset of the first entry it cannot decode, or of a
    partial entry at the end (a range read cuts between entries, so one is a bug)."""
    from broker.common.columns import decode_columns

    columns = decode_columns(buf, base, verify_crc)
    if columns.corrupt is not None:
        raise InvalidMessage(f"{topic}-{partition}: {columns.corrupt}")
    if columns.next_offset != base + len(buf):
        raise InvalidMessage(f"{topic}-{partition}: the set read at offset {base} ends in a partial entry at "
                             f"offset {columns.next_offset}")
    return record_batch(columns, topic, partition)
