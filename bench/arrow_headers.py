"""What the Arrow `headers` column costs the Spark data source's decode (not a test):
one 8 MiB-class fetch decoded (`decode_columns`), turned into Arrow (`to_arrow`), and
the headers column alone (`_headers_array`), for native messages (no headers: an empty
list each) and for Kafka batches whose every record has one header. Best and median of
`--repeat` runs.

    .venv/bin/python -m bench.arrow_headers --messages 36000 --repeat 30
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pyarrow as pa
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker.common.columns import decode_columns
from broker.common.columns_arrow import _headers_array
from broker.common.kafka.records import kafka_entry
from broker.common.message import encode_message_set

VALUE = b"x" * 200


def native_fetch(n: int) -> bytes:
    return b"".join(bytes(encode_message_set([(None, VALUE, 1_700_000_000_000 + j) for j in range(i, min(i + 1000, n))]))
                    for i in range(0, n, 1000))


def kafka_fetch(n: int) -> bytes:
    """Magic-4 entries of 500 records, each with one header, as the broker stores them."""
    parts, offset = [], 0
    for i in range(0, n, 500):
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                            producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
        for j in range(min(500, n - i)):
            builder.append(j, timestamp=1_700_000_000_000 + i + j, key=None, value=VALUE,
                           headers=[("trace", b"%08d" % (i + j))])
        entry = kafka_entry(bytes(builder.build()), offset, 0, 1_700_000_000_000 + i + 499)
        parts.append(entry)
        offset += len(entry)
    return b"".join(parts)


def timed(fn, repeat: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return min(runs) * 1e3, statistics.median(runs) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=36_000)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)
    for name, buf in (("native, no headers", native_fetch(args.messages)),
                      ("Kafka, one header each", kafka_fetch(args.messages))):
        columns = decode_columns(buf, 0)
        assert len(columns) == args.messages, len(columns)
        rows = [("decode_columns", lambda: decode_columns(buf, 0)), ("to_arrow", lambda: columns.to_arrow("t", 0)),
                ("headers column alone", lambda: _headers_array(pa, np, len(columns), columns.headers))]
        for label, fn in rows:
            best, median = timed(fn, args.repeat)
            print(f"{name:24s} {label:22s} best {best:8.2f} ms  median {median:8.2f} ms  ({args.messages} messages, "
                  f"{len(buf) / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
