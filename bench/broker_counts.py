"""The cost of the brokers' record counts (the audit's `broker` tier, broker/server/audit.py).

1. Counting alone, in this process: records/s `PartitionCounts.count_entries` counts of
   200-byte records in plain entries, producer batches of 50, gzip sets of 50 and stored
   Kafka batches of 50 and of 4,500 (magic 4; librdkafka at batch.size 1 MB sends ~4,500).
   And what a log's tally costs an append (`Tally.note`, ns, sets in one window).
2. The produce path with counting on and off: `bench.raw`'s acks=0 produce (batch 50,
   two connections, one partition each) into a fresh broker with
   `audit.count.interval.ms` = 0 (off) and 1000, alternating, `--rounds` times each; and
   with counting on, how long after the last append the node covers every record. Also
   the broker process's CPU time (user + system) a record, from the produce's start to
   its records flushed (and, on, to their count): on a shared machine the rate is noisy,
   the CPU the broker spent much less so.

    .venv/bin/python -m bench.broker_counts --messages 1000000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from broker.client.brokercounts import read_broker_counts
from broker.client.connection import BrokerConnection
from broker.common.auditcounts import PartitionCounts
from broker.common.message import BatchIdentity, encode_batch, encode_message_set
from bench.raw import MESSAGE_BYTES, run_produce, wait_flushed
from harness.cluster import LocalCluster
from harness.process import cpu_seconds, wait_until
from harness.zookeeper import ZooKeeperServer, client

try:
    from broker.server.log.tally import Tally
except ImportError:  # run against a checkout from before the tally (to compare)
    Tally = None  # type: ignore[assignment,misc]


def kafka_entries(records: int, entries: int, now: int) -> bytes:
    """Stored magic-4 entries of uncompressed Kafka batches of `records` records each."""
    from aiokafka.record._crecords.default_records import DefaultRecordBatchBuilder  # noqa: PLC0415

    from broker.common.kafka.records import kafka_entry  # noqa: PLC0415

    out = bytearray()
    for _ in range(entries):
        builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 31)
        for i in range(records):
            builder.append(i, now, None, b"m" * MESSAGE_BYTES, [])
        out += kafka_entry(bytes(builder.build()), len(out), 0, now)
    return bytes(out)


def counting_alone(entries: int = 2000) -> list[tuple[str, float]]:
    now = int(time.time() * 1000)
    records = [(None, b"m" * MESSAGE_BYTES, now)] * 50
    kinds = {
        "plain entries": encode_message_set(records) * entries,
        "batches of 50": b"".join(encode_batch(records, BatchIdentity(1, 0, i * 50, 50)) for i in range(entries)),
        "gzip sets of 50": encode_message_set(records, "gzip") * entries,
        "Kafka batches of 50": kafka_entries(50, entries, now),
        "Kafka batches of 4,500": kafka_entries(4_500, max(1, entries * 50 // 4_500), now),
    }
    rows = []
    for name, data in kinds.items():
        counts = PartitionCounts(0, 0)
        start = time.perf_counter()
        counts.count_entries(data, 0, 0)
        rows.append((name, sum(counts.windows.values()) / (time.perf_counter() - start)))
    return rows


def tally_ns(appends: int = 200_000) -> float:
    """ns per `Tally.note` of a 50-record set in the current window: what the produce path pays."""
    tally, now = Tally(), int(time.time() * 1000)
    times, note, size = (now, now), tally.note, 50 * (MESSAGE_BYTES + 22)
    start = time.perf_counter()
    for i in range(appends):
        note(i * size, (i + 1) * size, 50, times)
    return (time.perf_counter() - start) / appends * 1e9


def produce_round(workdir: Path, interval_ms: int, messages: int) -> tuple[float, float | None, float, float | None]:
    """acks=0 produce rate (msg/s) into a fresh broker; with counting on, seconds from
    the last append to the counts covering it; the broker's CPU µs a record until the
    records were flushed, and (on) until they were counted."""
    with ZooKeeperServer(workdir / "zk") as zk, LocalCluster(zk.connect_string + "/bench", workdir) as cluster:
        broker = cluster.start_broker(0, {"log.flush.interval.messages": 50_000, "log.flush.interval.ms": 1000,
                                          "audit.count.interval.ms": interval_ms})
        with BrokerConnection(*broker.address) as admin:
            admin.create_topic("counted", 2)
        cpu = cpu_seconds(broker.process.pid)
        rate = run_produce(broker.port, "counted", messages, 50, 2)
        appended = time.monotonic()
        wait_flushed(broker.port, "counted", 2)
        flushed = (cpu_seconds(broker.process.pid) - cpu) / messages * 1e6
        if not interval_ms:
            return rate, None, flushed, None
        with client(zk.connect_string + "/bench") as zkc:
            wait_until(lambda: sum(read_broker_counts(zkc, ["counted"]).counts.values()) >= messages, 300,
                       "the counts to cover every record", 0.05)
        return rate, time.monotonic() - appended, flushed, (cpu_seconds(broker.process.pid) - cpu) / messages * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print("| counting alone | records/s |\n|---|---:|")
    for name, rate in counting_alone():
        print(f"| {name} | {rate:,.0f} |")
    if Tally is not None:
        print(f"\nthe tally on the produce path: {tally_ns():.0f} ns an append (Tally.note)\n")
    rates: dict[int, list[float]] = {0: [], 1000: []}
    cpus: dict[int, list[float]] = {0: [], 1000: []}
    counted_cpu: list[float] = []
    caught_up = []
    for _ in range(args.rounds):
        for interval in (0, 1000):
            with tempfile.TemporaryDirectory(prefix="logbus-bench-") as workdir:
                rate, lag, cpu, counted = produce_round(Path(workdir), interval, args.messages)
            rates[interval].append(rate)
            cpus[interval].append(cpu)
            if counted is not None:
                counted_cpu.append(counted)
            if lag is not None:
                caught_up.append(lag)
            print(f"audit.count.interval.ms={interval}: {rate:,.0f} msg/s, broker {cpu:.2f} CPU µs a record"
                  + (f", counted {lag:.1f} s after the last append" if lag is not None else ""), file=sys.stderr)
    print(f"\n| produce batch 50, acks=0 ({args.messages:,} x {MESSAGE_BYTES} B, median of {args.rounds}) | msg/s |")
    print("|---|---:|")
    for interval, values in rates.items():
        print(f"| audit.count.interval.ms={interval} | {statistics.median(values):,.0f} |")
    print(f"| ratio on / off | {statistics.median(rates[1000]) / statistics.median(rates[0]):.2f} |")
    print(f"\n| broker CPU µs a record (median of {args.rounds}) | off | on | on / off |\n|---|---:|---:|---:|")
    off, on = statistics.median(cpus[0]), statistics.median(cpus[1000])
    print(f"| produced and flushed | {off:.2f} | {on:.2f} | {on / off:.2f} |")
    print(f"| ... and counted | | {statistics.median(counted_cpu):.2f} | |")
    print(f"\ncounts cover every record {statistics.median(caught_up):.1f} s after the last append (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
