"""The Kafka codecs' costs (not a test): what the Kafka listener will pay per produced
batch and per fetched record (docs/kafka.md; BENCHMARKS.md, "Kafka codecs").

    .venv/bin/python -m bench.kafka_codec --rounds 5

Batches of `--records` records of `--value-bytes` bytes (JSON-like text, so codecs
compress as on real events) built by aiokafka's builder, as a Kafka producer sends
them. Each figure is the median of `--rounds` rounds of `--repeat` calls, in one run,
the alternatives interleaved round by round:

- store verbatim: check_batch (CRC, attributes, count, every record through aiokafka's
  C reader) + kafka_entry (patch baseOffset/epoch, the magic-4 entry and its CRC);
- walk in Python: the same record checks by a plain-Python varint walk (the reference
  the C reader is chosen over);
- convert to magic 3: check, then read every record and encode_batch (the alternative
  storage: per-record work, and record headers lost);
- request decode: kio's decode of the ProduceRequest v9 frame carrying the batch;
- magic 3 -> v2: a native idempotent batch as a RecordBatch v2 for a Kafka fetch;
- fetch cut: a region of stored magic-4 entries as the batches a fetch response sends;
- native read: a stored magic-4 entry's records as a native consumer gets them
  (`iter_messages`; `decode_columns(...).messages()`, the consumers' path), beside the
  same records in a native magic-2 set;
- span rule: the smallest power-of-two count of identical records (one timestamp) at
  which a compressed batch holds more records than its entry spans bytes (then the
  broker stores it decompressed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import time
from typing import Callable

from aiokafka.record._crecords.default_records import DefaultRecordBatchBuilder
from kafka.protocol.producer.produce import ProduceRequest

from broker.common.compression import Codec, compress, decompress
from broker.common.kafka import frames
from broker.common.kafka.fetch import fetch_batches, read_records
from broker.common.kafka.records import ATTRIBUTES_AT, BATCH_HEADER, BATCH_HEADER_SIZE, check_batch, kafka_entry
from broker.common.columns import decode_columns
from broker.common.message import BatchIdentity, checksum, encode_batch, encode_message_set, iter_messages

CODECS = {"none": Codec.NONE, "gzip": Codec.GZIP, "lz4": Codec.LZ4, "zstd": Codec.ZSTD}


def kafka_batch(records: int, value_bytes: int, codec: Codec, same: bytes | None = None) -> bytes:
    """A producer's batch: aiokafka's builder, its records compressed with the broker's
    codecs (aiokafka's own need cramjam) and the header's length, codec and CRC set."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, 1000, 0, 0, 1 << 30)
    for i in range(records):
        value = same if same is not None else _event(i, value_bytes)
        builder.append(i, 1_700_000_000_000 + (0 if same is not None else i), None, value, [])
    batch = bytes(builder.build())
    if codec is Codec.NONE:
        return batch
    out = bytearray(batch[:BATCH_HEADER_SIZE]) + compress(codec, batch[BATCH_HEADER_SIZE:])
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">h", out, ATTRIBUTES_AT, int(codec))
    struct.pack_into(">I", out, 17, checksum(memoryview(out)[ATTRIBUTES_AT:]))
    return bytes(out)


def _event(i: int, size: int) -> bytes:
    text = json.dumps({"user": f"u{i * 7919 % 10007}", "page": f"/item/{i * 31 % 997}", "ms": 1700000000000 + i})
    return (text * (size // len(text) + 1)).encode()[:size]


def store_verbatim(batch: bytes) -> bytes:
    produced = check_batch(batch)
    return kafka_entry(batch, 123_456, 3, produced.max_timestamp)


def convert_to_magic3(batch: bytes) -> bytes:
    produced = check_batch(batch)
    messages = [(r.key, r.value or b"", r.timestamp) for r in read_records(batch)]
    identity = produced.identity or BatchIdentity(-1, -1, -1, produced.records)
    return encode_batch(messages, identity, produced.codec)


def python_walk(batch: bytes) -> int:
    """Every record's fields by varints in Python: length, attributes, timestampDelta,
    offsetDelta (checked), key, value, headers; returns the record count."""
    count, codec = BATCH_HEADER.unpack_from(batch, 0)[12], BATCH_HEADER.unpack_from(batch, 0)[5] & 7
    buf = decompress(Codec(codec), memoryview(batch)[BATCH_HEADER_SIZE:]) if codec else memoryview(batch)[61:]
    pos = 0
    for i in range(count):
        length, pos = _varint(buf, pos)
        end = pos + length
        pos += 1  # attributes
        _, pos = _varint(buf, pos)
        delta, pos = _varint(buf, pos)
        if delta != i:
            raise ValueError("offsetDelta")
        for _ in range(2):
            size, pos = _varint(buf, pos)
            pos += max(size, 0)
        headers, pos = _varint(buf, pos)
        for _ in range(headers * 2):
            size, pos = _varint(buf, pos)
            pos += max(size, 0)
        if pos != end:
            raise ValueError("record length")
    return count


def _varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7


def produce_frame(batch: bytes) -> bytes:
    request = ProduceRequest(acks=-1, timeout_ms=30000, topic_data=[ProduceRequest.TopicProduceData(
        name="events", partition_data=[ProduceRequest.TopicProduceData.PartitionProduceData(
            index=0, records=batch, version=9)], version=9)], version=9)
    request.with_header(correlation_id=1, client_id="bench")
    return bytes(request.encode(header=True))


def span_threshold(codec: Codec, value: bytes, limit: int) -> int:
    """Smallest power-of-two count of identical records whose compressed batch breaks
    the rule (its magic-4 entry spans fewer bytes than it holds records)."""
    n = 1
    while n <= limit:
        if check_batch(kafka_batch(n, 0, codec, same=value), max_bytes=1 << 30).store_decompressed:
            return n
        n *= 2
    return -1


def timed(fn: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=50)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=400)
    parser.add_argument("--region-mib", type=float, default=1.0)
    parser.add_argument("--span-max", type=int, default=1 << 18, help="largest batch the span rule tries")
    args = parser.parse_args()
    n, repeat = args.records, args.repeat
    batches = {name: kafka_batch(n, args.value_bytes, codec) for name, codec in CODECS.items()}
    native = encode_batch([(None, _event(i, args.value_bytes), 1_700_000_000_000) for i in range(n)],
                          BatchIdentity(7, 0, 0, n))
    stored, position = [], 0
    while position < args.region_mib * (1 << 20):
        entry = kafka_entry(batches["none"], position, 0, 1_700_000_000_000)
        stored.append(entry)
        position += len(entry)
    region = b"".join(stored)
    region_records = len(stored) * n
    cases: dict[str, tuple[Callable[[], object], int]] = {}
    for name, batch in batches.items():
        cases[f"store verbatim {name}"] = ((lambda b=batch: store_verbatim(b)), n)
        cases[f"walk in Python {name}"] = ((lambda b=batch: python_walk(b)), n)
        cases[f"convert to magic 3 {name}"] = ((lambda b=batch: convert_to_magic3(b)), n)
    plain = encode_message_set([(None, _event(i, args.value_bytes), 1_700_000_000_000) for i in range(n)])
    for name, data in ((f"magic 4 {name}", kafka_entry(batches[name], 0, 0, 1)) for name in ("none", "lz4")):
        cases[f"native read {name}: iter_messages"] = ((lambda d=data: list(iter_messages(d, 0))), n)
        cases[f"native read {name}: decode_columns"] = ((lambda d=data: decode_columns(d, 0).messages()), n)
    cases["native read magic 2: iter_messages"] = ((lambda: list(iter_messages(plain, 0))), n)
    cases["native read magic 2: decode_columns"] = ((lambda: decode_columns(plain, 0).messages()), n)
    frame = produce_frame(batches["none"])
    cases["request decode (kio, Produce v9)"] = ((lambda: frames.decode_request(frame)), n)
    cases["magic 3 -> v2 (fetch of a native batch)"] = ((lambda: fetch_batches(native, 0)), n)
    cases[f"fetch cut ({len(region) >> 10} KiB of magic 4)"] = ((lambda: b"".join(fetch_batches(region, 0))),
                                                              region_records)
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (fn, _records) in cases.items():
            reps = max(1, repeat // 20) if name.startswith("fetch cut") else repeat
            results[name].append(timed(fn, reps))
    print(f"batches of {n} records of {args.value_bytes} B; sizes: "
          + ", ".join(f"{k} {len(v)} B" for k, v in batches.items()))
    print(f"{'':44} {'us/batch':>10} {'us/record':>10} {'records/s':>12}")
    for name, (_, records) in cases.items():
        per_call = statistics.median(results[name])
        per_record = per_call / records
        label = "us/region" if name.startswith("fetch cut") else ""
        print(f"{name:44} {per_call:10.1f} {per_record:10.3f} {1e6 / per_record:12,.0f} {label}".rstrip())
    for name in ("lz4", "zstd"):
        for value in (b"", b"x" * 10):
            print(f"span rule: {name}, identical {len(value)}-byte values: breaks from "
                  f"{span_threshold(CODECS[name], value, args.span_max)} records a batch (-1: none up to {args.span_max})")


if __name__ == "__main__":
    main()
