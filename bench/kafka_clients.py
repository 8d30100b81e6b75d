"""librdkafka (confluent-kafka) against one broker's Kafka listener (issue 36, "Measure";
not a test): the producer at acks=1, at acks=all and at acks=all idempotent, 200-byte
records, with the settings a throughput-minded user sets (linger.ms 5, batch.size 1 MB,
batch.num.messages 10,000, no compression; the consumer's fetch.queue.backoff.ms 10);
`bench.raw`'s pre-encoded native frames at batch 50 on the same broker, in turn, for
the ratio the issue asks (≥ 0.8); then one librdkafka consumer reading the round's
acks=1 partition from the start (assigned, no group membership). Rounds, medians.

    PYTHONPATH=$PWD .venv/bin/python -m bench.kafka_clients --records 1000000 --rounds 3

Each producer row gives records/s (wall clock from the first `produce` until `flush`
returns), the producing process's CPU µs per record (user + system, every thread:
librdkafka's are in it) and the broker's (its process, from /proc). Goals: producer ≥
300,000 records/s, consumer ≥ 500,000 records/s. Producer, broker and ZooKeeper share
the machine's cores, as in `bench.clients`.

Every run — the consumer's above all — starts on a quiet broker (`Quiet.wait`): what was
produced before is flushed (`log.flush.interval.ms` has passed since the last run), the
brokers' record counts (broker/server/audit.py, a round every
`audit.count.interval.ms`) have counted it, and the broker's CPU is idle. Without that,
the consumer, run right after a producer, shared the broker with the last flush and a
count of the records just produced, and waited for that flush to see the tail.

The idempotent producer sends one Produce request at a time per partition (librdkafka
counts messages, not requests, against its in-flight limit of 5), and acks=all on one
replica answers after the fsync (docs/protocol.md): its rate is a batch per round trip
(BENCHMARKS.md, "librdkafka against one broker").

A million records a run by default: at 300,000 a consumer's run lasts half a second,
most of it librdkafka filling its queue from the first fetches, and read 295,062
records/s against 610,053 for a million in the same quiet hour.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from bench.paper.librdkafka_side import received
from bench.raw import run_produce
from broker.client.connection import BrokerConnection
from broker.common.auditcounts import PartitionCounts, audit_path
from harness.cluster import BrokerProcess, scratch_cluster
from harness.process import cpu_seconds, wait_until

SIZE = 200
GOALS = {"producer": 300_000, "consumer": 500_000}
# bench.raw's flush policy: fsync every 50,000 messages or 1 s
BROKER_SETTINGS = {"log.flush.interval.messages": 50_000, "log.flush.interval.ms": 1000}
PRODUCERS = {
    "acks=1": {"acks": "1", "enable.idempotence": False},
    "acks=all": {"acks": "all", "enable.idempotence": False},
    "acks=all idempotent": {"acks": "all", "enable.idempotence": True},
}
# librdkafka stops fetching for fetch.queue.backoff.ms (default 1 s) whenever its local
# queue holds queued.min.messages (100,000): a Python consumer reading 300,000 records
# hit that pause once or not at all, 160,000 or 940,000 records/s run by run
CONSUMER = {"fetch.queue.backoff.ms": 10}
THROUGHPUT = {"linger.ms": 5, "batch.size": 1_000_000, "batch.num.messages": 10_000, "compression.type": "none",
              "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576}


def settle(pid: int, seconds: float = 0.5) -> None:
    """Wait until the broker is idle (under 5% of a core for `seconds`)."""
    def idle() -> bool:
        before = cpu_seconds(pid)
        time.sleep(seconds)
        return cpu_seconds(pid) - before < 0.05 * seconds

    wait_until(idle, 60, "the broker idle", 0)


class Quiet:
    """Starts each run on a quiet broker: everything produced before is flushed and
    counted by the brokers' record counts, and the broker idle (module docstring)."""

    def __init__(self, zookeeper: str, port: int, pid: int) -> None:
        self.zk = KazooClient(zookeeper)
        self.zk.start(30)
        self.port, self.pid = port, pid
        self.partitions: list[tuple[str, int]] = []
        self.last_run = 0.0

    def produced(self, topic: str, partitions: int) -> None:
        self.partitions += [(topic, p) for p in range(partitions)]
        self.last_run = time.monotonic()

    def wait(self) -> None:
        """The flush timer has fired since the last run (so the flushed end is the log
        end), every partition is counted up to it, and the broker is idle."""
        time.sleep(max(0.0, self.last_run + BROKER_SETTINGS["log.flush.interval.ms"] / 1000 + 0.2 - time.monotonic()))
        with BrokerConnection("127.0.0.1", self.port, client_id="bench") as conn:
            wait_until(lambda: all(self._counted(conn, t, p) for t, p in self.partitions), 120,
                       "the broker's record counts of what was produced", 0.2)
        settle(self.pid)

    def _counted(self, conn: BrokerConnection, topic: str, partition: int) -> bool:
        """The audit's `upto` of the partition is its flushed end (no node: not counted yet)."""
        try:
            node, _ = self.zk.get(audit_path(topic, partition))
        except NoNodeError:
            return False
        return PartitionCounts.decode(node).upto == conn.offsets(topic, partition, -1)[0]

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()


def produce(bootstrap: str, topic: str, records: int, settings: dict, broker: int
            ) -> tuple[float, float, float]:
    """(records/s, producer CPU µs a record, broker CPU µs a record)."""
    failed: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            failed.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, **THROUGHPUT, **settings})
    producer.list_topics(topic, timeout=30)  # metadata and connection before the clock
    value = b"x" * SIZE
    send, poll = producer.produce, producer.poll
    start, cpu, broker_cpu = time.perf_counter(), time.process_time(), cpu_seconds(broker)
    for _ in range(records):
        while True:
            try:
                send(topic, value, partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                poll(0.005)
    left = producer.flush(300)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    broker_cpu = cpu_seconds(broker) - broker_cpu
    if left or failed:
        raise RuntimeError(f"librdkafka producer: {left} records not delivered, errors {failed[:3]}")
    return records / elapsed, cpu / records * 1e6, broker_cpu / records * 1e6


def consume(bootstrap: str, topic: str, records: int, broker: int) -> tuple[float, float, float]:
    """(records/s, consumer CPU µs a record, broker CPU µs a record) of one consumer
    reading `records` from the start of partition 0; the clock starts at the first
    record."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-kafka-clients",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100, **CONSUMER})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        first = consumer.consume(1, 30)
        if not first or first[0].error():
            raise RuntimeError(f"librdkafka consumer: no first record ({first and first[0].error()})")
        got, empty = 1, 0
        start, cpu, broker_cpu = time.perf_counter(), time.process_time(), cpu_seconds(broker)
        while got < records and empty < 50:
            n = received(consumer, 10_000)
            empty = 0 if n else empty + 1
            got += n
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        broker_cpu = cpu_seconds(broker) - broker_cpu
    finally:
        consumer.close()
    if got != records:
        raise RuntimeError(f"librdkafka consumer read {got:,} of {records:,} records")
    return (got - 1) / elapsed, cpu / (got - 1) * 1e6, broker_cpu / (got - 1) * 1e6


def create(port: int, topic: str, partitions: int) -> None:
    with BrokerConnection("127.0.0.1", port, client_id="bench") as conn:
        conn.create_topic(topic, partitions)
        wait_until(lambda: all(conn.offsets(topic, p, -1) is not None for p in range(partitions)), 30,
                   f"{topic} opened on the broker")


def median_row(name: str, values: list[tuple[float, ...]]) -> tuple[str, tuple[float, ...]]:
    return name, tuple(statistics.median(v[i] for v in values) for i in range(len(values[0])))


def run_round(r: int, records: int, broker: BrokerProcess, quiet: Quiet,
              results: dict[str, list[tuple[float, ...]]]) -> None:
    """One round: raw frames, each producer, then the consumer of the round's acks=1
    partition, each run on a quiet broker."""
    def note(name: str, row: tuple[float, ...]) -> None:
        results.setdefault(name, []).append(row)
        cpu = f", {row[1]:.2f} / {row[2]:.2f} CPU µs a record (client / broker)" if len(row) > 1 else ""
        print(f"round {r + 1} {name}: {row[0]:,.0f} records/s{cpu}, load {os.getloadavg()[0]:.2f}", file=sys.stderr)

    create(broker.port, f"raw-{r}", 2)
    quiet.wait()
    note("native raw batch 50, acks=0", (run_produce(broker.port, f"raw-{r}", records, 50, 2),))
    quiet.produced(f"raw-{r}", 2)
    topics = {}
    for name, settings in PRODUCERS.items():
        topics[name] = topic = f"kafka-{r}-{name.replace('=', '').replace(' ', '-')}"
        create(broker.port, topic, 1)
        quiet.wait()
        note(f"producer {name}", produce(broker.kafka_bootstrap, topic, records, settings, broker.process.pid))
        quiet.produced(topic, 1)
    quiet.wait()
    note("consumer", consume(broker.kafka_bootstrap, topics["acks=1"], records, broker.process.pid))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records per run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    results: dict[str, list[tuple[float, ...]]] = {}
    load = os.getloadavg()[0]
    with scratch_cluster("logbus-bench-kafka-") as (_, cluster):
        broker = cluster.start_broker(0, BROKER_SETTINGS, kafka=True)
        quiet = Quiet(cluster.zookeeper, broker.port, broker.process.pid)
        try:
            for r in range(args.rounds):
                run_round(r, args.records, broker, quiet, results)
        finally:
            quiet.close()
    raw = statistics.median(v[0] for v in results["native raw batch 50, acks=0"])
    print(f"\n{args.records:,} records of {SIZE} bytes, {args.rounds} rounds (medians), "
          f"load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end\n")
    print("| run | records/s | client CPU µs/record | broker CPU µs/record | / raw batch 50 | goal |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| native raw batch 50, acks=0 | {raw:,.0f} | | | 1.00 | |")
    for name in [f"producer {n}" for n in PRODUCERS] + ["consumer"]:
        _, values = median_row(name, results[name])
        goal = GOALS[name.split()[0]]
        ratio = f"{values[0] / raw:.2f}" if name.startswith("producer") else "—"  # raw is a produce path
        print(f"| librdkafka {name} | {values[0]:,.0f} | {values[1]:.2f} | {values[2]:.2f} | {ratio} | {goal:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
