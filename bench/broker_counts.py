"""The cost of the brokers' record counts (the audit's `broker` tier, broker/server/audit.py).

1. Counting alone, in this process: records/s `PartitionCounts.count_entries` counts of
   200-byte records in plain entries, producer batches of 50, gzip sets of 50 and stored
   Kafka batches of 50 and of 4,500 (magic 4; librdkafka at batch.size 1 MB sends ~4,500).
2. The produce path with counting on and off: `bench.raw`'s acks=0 produce (batch 50,
   two connections, one partition each) into a fresh broker with
   `audit.count.interval.ms` = 0 (off) and 1000, alternating, `--rounds` times each; and
   with counting on, how long after the last append the node covers every record.

    .venv/bin/python -m bench.broker_counts --messages 1000000 --rounds 3
"""

from __future__ import annotations

import argparse
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
from harness.process import wait_until
from harness.zookeeper import ZooKeeperServer, client


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


def produce_round(workdir: Path, interval_ms: int, messages: int) -> tuple[float, float | None]:
    """acks=0 produce rate (msg/s) into a fresh broker, and with counting on, seconds
    from the last append to the counts covering it."""
    with ZooKeeperServer(workdir / "zk") as zk, LocalCluster(zk.connect_string + "/bench", workdir) as cluster:
        broker = cluster.start_broker(0, {"log.flush.interval.messages": 50_000, "log.flush.interval.ms": 1000,
                                          "audit.count.interval.ms": interval_ms})
        with BrokerConnection(*broker.address) as admin:
            admin.create_topic("counted", 2)
        rate = run_produce(broker.port, "counted", messages, 50, 2)
        appended = time.monotonic()
        if not interval_ms:
            return rate, None
        wait_flushed(broker.port, "counted", 2)
        with client(zk.connect_string + "/bench") as zkc:
            wait_until(lambda: sum(read_broker_counts(zkc, ["counted"]).counts.values()) >= messages, 300,
                       "the counts to cover every record", 0.05)
        return rate, time.monotonic() - appended


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print("| counting alone | records/s |\n|---|---:|")
    for name, rate in counting_alone():
        print(f"| {name} | {rate:,.0f} |")
    rates: dict[int, list[float]] = {0: [], 1000: []}
    caught_up = []
    for _ in range(args.rounds):
        for interval in (0, 1000):
            with tempfile.TemporaryDirectory(prefix="logbus-bench-") as workdir:
                rate, lag = produce_round(Path(workdir), interval, args.messages)
            rates[interval].append(rate)
            if lag is not None:
                caught_up.append(lag)
            print(f"audit.count.interval.ms={interval}: {rate:,.0f} msg/s"
                  + (f", counted {lag:.1f} s after the last append" if lag is not None else ""), file=sys.stderr)
    print(f"\n| produce batch 50, acks=0 ({args.messages:,} x {MESSAGE_BYTES} B, median of {args.rounds}) | msg/s |")
    print("|---|---:|")
    for interval, values in rates.items():
        print(f"| audit.count.interval.ms={interval} | {statistics.median(values):,.0f} |")
    print(f"| ratio on / off | {statistics.median(rates[1000]) / statistics.median(rates[0]):.2f} |")
    print(f"\ncounts cover every record {statistics.median(caught_up):.1f} s after the last append (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
