"""Benchmark (not a test): registry-framed Avro against JSON in the load, for the same
records (issue 37). Records per second on one core:

1. the decoding alone, in this process: `decode_framed.decode_value` per framed value
   (what the load's Python UDF does for `--format confluent`, the writer schema cached)
   against `reader_json.parse_values` over the JSON values (the data source's pyarrow
   parse, one call per fetch of values) and, for reference, `json.loads` per value;
2. the whole load (`run_load`: the `logbus` data source, decoding, the pyarrow Parquet
   writer) on Spark `local[1]` — one task at a time — of a topic of JSON values and a
   topic of the same records framed in Avro, alternating which goes first.

    .venv/bin/python -m bench.avro_decode --messages 200000 --rounds 3

The records are `bench.spark_load`'s (200 bytes of JSON: server, n, ts_ms, page, pad);
their Avro encoding is smaller (its size is printed). ZooKeeper, a broker, a `logbus
schema-registry` and Spark's JVM run only meanwhile, in a scratch directory.
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import sys
import time
from contextlib import ExitStack

from broker.client.connection import BrokerConnection
from bench.spark_load import SCHEMA, print_ratio, produce, value
from harness.cluster import scratch_cluster
from harness.process import wait_until
from harness.registry import RegistryProcess
from harness.spark import local_session

AVRO = {"type": "record", "name": "Activity", "fields": [
    {"name": "server", "type": "string"}, {"name": "n", "type": "long"}, {"name": "ts_ms", "type": "long"},
    {"name": "page", "type": "string"}, {"name": "pad", "type": "string"}]}
HEADER = 22  # bytes of a message entry besides its value (bench.spark_load.ENTRY - 200)


class Framing:
    """The records as Confluent-framed Avro: magic 0, the registered schema's id, the
    Avro binary (what confluent_kafka's AvroSerializer writes)."""

    def __init__(self, registry_url: str) -> None:
        import fastavro
        import httpx

        answer = httpx.post(f"{registry_url}/subjects/activity-value/versions", json={"schema": json.dumps(AVRO)})
        answer.raise_for_status()
        self.header = struct.pack(">bI", 0, answer.json()["id"])
        self.parsed = fastavro.parse_schema(AVRO)

    def __call__(self, i: int, ts: int) -> bytes:
        import fastavro

        out = io.BytesIO()
        out.write(self.header)
        fastavro.schemaless_writer(out, self.parsed, json.loads(value(i, ts)))
        return out.getvalue()


def best_rate(count: int, fn, repeat: int) -> float:
    """Records per second of the fastest of `repeat` runs of `fn` over `count` records."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return count / best


def decode_alone(registry_url: str, framing: Framing, count: int, repeat: int) -> None:
    import pyarrow as pa

    from airflow_provider_logbus.schema import load_schema
    from airflow_provider_logbus.registry_access import RegistryAccess
    from airflow_provider_logbus.spark.decode_fit import TableFit
    from airflow_provider_logbus.spark.decode_framed import decode_value
    from airflow_provider_logbus.spark.reader_json import parse_values

    records = [value(i, 1_700_000_000_000 + i) for i in range(count)]
    framed = [framing(i, 1_700_000_000_000 + i) for i in range(count)]
    arrow = load_schema(SCHEMA).to_arrow()
    value_type = pa.struct([f.with_nullable(True) for f in arrow])
    fetch = (8 << 20) // 200  # values per 8 MiB fetch: the data source parses a fetch at a time
    batches = [pa.array(records[i:i + fetch], pa.binary()) for i in range(0, count, fetch)]
    registry, table = RegistryAccess(registry_url), TableFit(arrow)
    decode_value(framed[0], registry, table)  # the writer schema into the process's cache

    def avro() -> None:
        for v in framed:
            decode_value(v, registry, table)

    def pyarrow_json() -> None:
        for batch in batches:
            parsed, _ = parse_values(batch, value_type, [], keep_values=False)
            assert parsed.null_count == 0

    def json_loads() -> None:
        for v in records:
            json.loads(v)

    print(f"{count} records: JSON {sum(map(len, records)) / count:.0f} bytes, framed Avro "
          f"{sum(map(len, framed)) / count:.0f} bytes a record", flush=True)
    for name, fn in (("decode alone: Avro decode_value (per value)", avro),
                     ("decode alone: JSON parse_values (pyarrow)", pyarrow_json),
                     ("decode alone: JSON json.loads (per value)", json_loads)):
        print(f"{name:<48} {best_rate(count, fn, repeat):>12,.0f} records/s", flush=True)


def whole_load(spark, zookeeper: str, registry_url: str, topics: dict[str, list], count: int, rounds: int,
               work) -> dict[str, list[float]]:
    """records/s of `run_load` of each topic on local[1], warmed up first, alternating."""
    from airflow_provider_logbus.spark.load_job import run_load

    def load(fmt: str, out: str, ranges: list) -> dict:
        result = run_load(spark, ranges, out, zookeeper=zookeeper, value_format=fmt, schema=SCHEMA,
                          registry_url=registry_url if fmt == "confluent" else None)
        if result["rejected_count"]:
            raise RuntimeError(f"{fmt}: {result['rejected_count']} values rejected: {result['rejected']}")
        return result

    order = [t for t in topics if not t.endswith("-warm-up")]
    for fmt in order:  # warm-up: the Python workers and their imports, the writer schema
        load(fmt, str(work / f"warm-up-{fmt}"), topics[f"{fmt}-warm-up"])
    rates: dict[str, list[float]] = {}
    for round_ in range(rounds):
        for fmt in (order if round_ % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            rows = load(fmt, str(work / f"{fmt}-{round_}"), topics[fmt])["row_count"]
            elapsed = time.perf_counter() - start
            if rows != count:
                raise RuntimeError(f"{fmt}: {rows} rows loaded of {count}")
            rates.setdefault(fmt, []).append(count / elapsed)
            print(f"whole load, local[1]: {fmt:<10} {elapsed:7.1f} s {count / elapsed:>10,.0f} records/s", flush=True)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3, help="whole loads of each format, alternating")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each decoding alone (the best is kept)")
    args = parser.parse_args(argv)
    from airflow_provider_logbus.cluster import LogbusCluster
    from airflow_provider_logbus.plan import Range

    with scratch_cluster("logbus-bench-avro-", {"log.flush.interval.ms": 100}) as (_, cluster), ExitStack() as stack:
        work = cluster.workdir
        broker = cluster.start_broker(0)
        registry = RegistryProcess(cluster.zookeeper, work).start()
        stack.callback(registry.stop)
        framing = Framing(registry.url)
        decode_alone(registry.url, framing, min(args.messages, 50_000), args.repeat)
        topics = {}
        with BrokerConnection(*broker.address) as conn, LogbusCluster(cluster.zookeeper) as logbus:
            for fmt, encode in (("json", value), ("confluent", framing)):
                for topic, count in ((fmt, args.messages), (f"{fmt}-warm-up", 100)):
                    conn.create_topic(topic, 1)
                    wait_until(lambda: logbus.partitions(topic) == [0], 30, f"topic {topic}")
                    size = produce(conn, topic, count, 1, encode=encode) + count * HEADER
                    wait_until(lambda: logbus.latest(topic, 0) == size, 60, f"{topic} flushed")
                    topics[topic] = [Range(topic, 0, 0, size)]
        spark = stack.enter_context(local_session("local[1]", conf={"spark.driver.memory": "2g"}))
        rates = whole_load(spark, cluster.zookeeper, registry.url, topics, args.messages, args.rounds, work)
    print_ratio("Avro / JSON, whole load", rates["confluent"], rates["json"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
