"""The message format decoded into columns (docs/protocol.md, "Message format"): one
Arrow record batch per fetched buffer, without a Python object per message for plain
entries — what readers that want throughput (the Spark data source) take. Owned by the
format: magics 1 and 2 are read in place with numpy; wrappers (compressed sets and
producer batches, magic 3) are opened through `broker.common.message.decode_messages`.

pyarrow and numpy are imported when called, so the shared contracts need neither.
"""

from __future__ import annotations

from broker.common.errors import InvalidMessage
from broker.common.message import CODEC_MASK, HEADER, HEADER_SIZE, MAGIC_BATCH, decode_messages, entry_crc

COLUMNS = ["topic", "partition", "offset", "timestamp", "key", "value"]


def _binary_array(pa, np, arr, starts, lengths, valid=None):
    """A BinaryArray of arr[starts[i]:starts[i]+lengths[i]] without a Python object per value."""
    n = len(starts)
    lengths = np.where(valid, lengths, 0) if valid is not None else lengths
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1]:
        delta = np.zeros(len(arr) + 1, dtype=np.int8)
        nonempty = lengths > 0
        delta[starts[nonempty]] += 1
        delta[(starts + lengths)[nonempty]] -= 1
        data = arr[np.cumsum(delta[:-1], dtype=np.int8).astype(bool)]
    else:
        data = np.zeros(0, dtype=np.uint8)
    validity = None
    if valid is not None and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)])


def decode_arrow(topic: str, partition: int, base: int, buf: bytes, verify_crc: bool = True):
    """One RecordBatch (`COLUMNS`; timestamps in microseconds, UTC) of a buffer of whole
    entries at offsets base..base+len(buf). Raises InvalidMessage naming `topic-partition`
    and the offset of the first entry it cannot decode."""
    import numpy as np
    import pyarrow as pa

    n_max = len(buf) // HEADER_SIZE + 1
    positions = np.empty(n_max, dtype=np.int64)
    timestamps = np.empty(n_max, dtype=np.int64)
    key_lengths = np.empty(n_max, dtype=np.int32)
    sizes = np.empty(n_max, dtype=np.int64)
    unpack = HEADER.unpack_from
    view = memoryview(buf)
    pos, end, i, wrapped = 0, len(buf), 0, False
    while pos < end:
        size, magic, attributes, crc, timestamp, key_length = unpack(buf, pos)
        if attributes & CODEC_MASK or magic == MAGIC_BATCH:
            wrapped = True
            break
        entry_end = pos + 4 + size
        if verify_crc and entry_crc(view, pos, entry_end, magic, attributes) != crc:
            raise InvalidMessage(f"{topic}-{partition}: corrupt entry at offset {base + pos}: CRC mismatch")
        positions[i], timestamps[i], key_lengths[i], sizes[i] = pos, timestamp, key_length, size
        i += 1
        pos = entry_end
    view.release()
    if wrapped:  # compressed sets and producer batches: message by message
        messages, corrupt = decode_messages(buf, base, verify_crc)
        if corrupt is not None:
            raise InvalidMessage(f"{topic}-{partition}: {corrupt}")
        return pa.RecordBatch.from_arrays(
            [pa.array([topic] * len(messages), pa.string()), pa.array([partition] * len(messages), pa.int32()),
             pa.array([m.offset for m in messages], pa.int64()),
             pa.array([m.timestamp for m in messages], pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
             .cast(pa.timestamp("us", tz="UTC")),
             pa.array([m.key for m in messages], pa.binary()), pa.array([m.value for m in messages], pa.binary())],
            names=COLUMNS,
        )
    positions, timestamps, key_lengths, sizes = positions[:i], timestamps[:i], key_lengths[:i], sizes[:i]
    arr = np.frombuffer(buf, dtype=np.uint8)
    key_starts = positions + HEADER_SIZE
    has_key = key_lengths >= 0
    klen = np.maximum(key_lengths, 0).astype(np.int64)
    value_starts = key_starts + klen
    value_lengths = positions + 4 + sizes - value_starts
    return pa.RecordBatch.from_arrays(
        [
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(i, dtype=np.int32)), pa.array([topic])).cast(pa.string()),
            pa.array(np.full(i, partition, dtype=np.int32)),
            pa.array(positions + base),
            pa.array(timestamps * 1000, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            _binary_array(pa, np, arr, key_starts, klen, has_key),
            _binary_array(pa, np, arr, value_starts, value_lengths),
        ],
        names=COLUMNS,
    )
