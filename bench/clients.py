"""Client benchmark (not a test): the real `Producer` and `SimpleConsumer` against one
local broker, in the paper's setting — 200-byte messages, batch 1 and batch 50, acks 0
and 1 — and one consumer reading everything back.

    .venv/bin/python -m bench.clients --count 200000 [--send] [--send-many]
    .venv/bin/python -m bench.clients --count 200000 --consumer-rounds 3
    .venv/bin/python -m bench.clients --count 200000 --against-raw 3
    .venv/bin/python -m bench.clients --count 1000000 --gc-rounds 2 [--batches 50] [--monitoring]

Every producer row also gives the producing process's CPU time per message (user +
system, all its threads: what the producer takes from a web server's cores), and the
broker process's, with the share of the run its CPU was busy: near 1.00 the broker
bounds the row (its event loop is one thread), well under it the producer does.
`--against-raw N` measures only the Producer (acks 0, idempotence off) against
`bench.raw`'s pre-encoded frames — the broker's own ceiling — at batch 1 and 50 on one
broker, alternating, N rounds (issue 38): a message a call, and at batch 50 also 50 a
call.

`--gc-rounds N` measures only the Producer (acks 0, a message a call) at batch 1 and
50 (`--batches`), N rounds: its rate, CPU and the cyclic GC's share of that CPU — the
time between the collector's start and stop callbacks, and its collections of each
generation (issue 38: a tuple a message made it run every 700 messages).

`--consumer-rounds N` measures only the consumer's reads of one partition of magic-3
producer batches — as before issue 25 (`decode_messages`), iteration, and the batch
read — in turn, N times (issue 25).

The paper's producer gets nothing back (Kafka 0.7's `send`): the rows of the paper's
setting use `Producer.produce`, a message at a time without a future, as a web
server's producer calls it. (The paper's own tool, Kafka 0.7's `ProducerPerformance`,
handed a whole batch to one synchronous `send`: `bench.paper`'s "50 a call" rows.) `--send` adds acks-0 rows through `send`, which makes a
`RecordFuture` a message; `--send-many` adds the batch-50 runs through
`Producer.send_many` (lists of `MANY_CHUNK` messages per call), the entry point for
callers that have many messages at once.

The paper (Kafka, NetDB 2011) measured 50,000 msg/s (batch 1) and 400,000 msg/s
(batch 50) for the producer and 22,000 msg/s for the consumer, on two dedicated Linux
boxes. Here producer, broker and ZooKeeper share one 2-core machine, so the producer
process and the broker compete for the same cores: read the ratios with that in mind.
The default count (200,000 per run) keeps the whole run near a minute; the paper used
10 million.
"""

from __future__ import annotations

import argparse
import gc
import logging
import time
from contextlib import contextmanager
from typing import Iterator

from bench.raw import run_produce
from broker.client.connection import BrokerConnection
from broker.client.consumer import SimpleConsumer
from broker.client.producer import Producer
from broker.common.errors import LogbusError
from broker.common.message import decode_messages
from broker.common.zklayout import create_topic
from harness.cluster import scratch_cluster
from harness.process import cpu_seconds, wait_until
from harness.zookeeper import client

PAPER = {"batch 1": 50_000, "batch 50": 400_000, "consumer": 22_000}
SIZE = 200
MANY_CHUNK = 1000


CALLS = ("produce", "send", "send_many")


def produce(zk: str, topic: str, count: int, batch: int, acks: int, call: str = "produce",
            idempotent: bool | None = None, broker_pid: int | None = None,
            chunk: int = MANY_CHUNK, monitoring: bool = False) -> tuple[float, float, float, float]:
    """(msg/s, CPU µs per message, the broker's CPU µs per message, the broker's busy
    share): the clock and this process's CPU time (user + system, every thread: the
    caller's calls, the sender thread, ZooKeeper's) from the first call until `close`
    returns, through `call` (one of CALLS; `send_many` hands `chunk` messages a call);
    the broker's from /proc when `broker_pid` is given (NaN otherwise). Idempotence is
    on with acks 1 unless told; monitoring (the producer's audit counts, on by default
    in a `Producer`) only when told."""
    value = b"x" * SIZE
    broker_cpu = (lambda: cpu_seconds(broker_pid)) if broker_pid else (lambda: float("nan"))
    with Producer(zookeeper=zk, mode="async", acks=acks, batch_size=batch, linger_ms=5, monitoring=monitoring,
                  enable_idempotence=acks != 0 if idempotent is None else idempotent,
                  queue_size=50_000) as producer:  # closed also on failure: its ZooKeeper watches
        start, cpu, broker = time.perf_counter(), time.process_time(), broker_cpu()
        if call == "send_many":
            chunk = [value] * min(chunk, count)
            count -= count % len(chunk)
            for _ in range(count // len(chunk)):
                producer.send_many(topic, chunk)
        else:
            one = producer.send if call == "send" else producer.produce
            for _ in range(count):
                one(topic, value, partition=0)
        report = producer.close(300)
        elapsed, cpu, broker = time.perf_counter() - start, time.process_time() - cpu, broker_cpu() - broker
    assert not report.failed, report
    return count / elapsed, cpu / count * 1e6, broker / count * 1e6, broker / elapsed


def against_raw(rounds: int, count: int) -> None:
    """`--against-raw N`: the broker's own ceiling (`bench.raw`: pre-encoded acks=0
    frames from two processes, one partition each) and the real Producer (one process,
    one partition, acks 0, idempotence off) at batch 1 and 50 on one broker, in turn,
    N rounds; the Producer's share of the raw figure and its CPU per message. The
    Producer is called a message at a time (`produce`, a web server's producer), and at
    batch 50 also a batch a call (`send_many` of 50, as the paper's own tool sent and as
    `bench.raw` writes a set)."""
    rows: dict[str, list[float]] = {}
    with scratch_cluster("logbus-bench-clients-") as (zookeeper, cluster):
        broker = cluster.start_broker(0, {"log.flush.interval.ms": 200, "log.flush.interval.messages": 100_000})
        with client(zookeeper.connect_string) as zk:
            for r in range(rounds):
                for batch in (1, 50):
                    create_topic(zk, f"raw-{r}-{batch}", 2)
                    wait_until(lambda: broker_knows(broker.port, f"raw-{r}-{batch}", 2), 30, "raw topic on the broker")
                    raw_rate = run_produce(broker.port, f"raw-{r}-{batch}", count, batch, 2)
                    rows.setdefault(f"raw batch {batch}", []).append(raw_rate)
                    calls = [("produce", "producer")] + ([("send_many", "producer 50 a call")] if batch == 50 else [])
                    for call, label in calls:
                        create_topic(zk, f"{call}-{r}-{batch}", 1)
                        rate, cpu, _, _ = produce(zookeeper.connect_string, f"{call}-{r}-{batch}", count, batch, 0,
                                                  call, chunk=batch)
                        for name, v in ((f"{label} batch {batch}", rate), (f"{label}/raw batch {batch}", rate / raw_rate),
                                        (f"{label} CPU us/msg batch {batch}", cpu)):
                            rows.setdefault(name, []).append(v)
    print(f"{count} messages of {SIZE} bytes per run, acks 0, one broker, {rounds} rounds alternating")
    for name, values in rows.items():
        print(f"{name:40} " + " ".join(f"{v:10.2f}" if v < 100 else f"{v:10.0f}" for v in values))


@contextmanager
def gc_clock() -> Iterator[dict]:
    """The cyclic GC's seconds (`seconds`), collections per generation (`runs`) and
    longest collection in seconds (`longest`) in this process while the block runs, from
    the collector's own callbacks."""
    spent = {"seconds": 0.0, "runs": [0, 0, 0], "longest": 0.0}
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            took = time.perf_counter() - started[0]
            spent["seconds"] += took
            spent["longest"] = max(spent["longest"], took)
            spent["runs"][info["generation"]] += 1

    gc.callbacks.append(callback)
    try:
        yield spent
    finally:
        gc.callbacks.remove(callback)


def gc_rounds(rounds: int, count: int, batches: list[int], monitoring: bool) -> None:
    """`--gc-rounds N`: the Producer's rate, CPU and GC a message at each of `batches`,
    with its monitoring (audit counts) on if told."""
    with scratch_cluster("logbus-bench-clients-") as (zookeeper, cluster):
        cluster.start_broker(0, {"log.flush.interval.ms": 200, "log.flush.interval.messages": 100_000})
        print(f"{count} messages of {SIZE} bytes per run, acks 0, one broker, {rounds} rounds")
        with client(zookeeper.connect_string) as zk:
            for r in range(rounds):
                for batch in batches:
                    create_topic(zk, f"gc-{r}-{batch}", 1)
                    with gc_clock() as spent:
                        rate, cpu, _, _ = produce(zookeeper.connect_string, f"gc-{r}-{batch}", count, batch, 0,
                                                  monitoring=monitoring)
                    print(f"round {r + 1} batch {batch:2}: {rate:10.0f} msg/s, CPU {cpu:6.2f} us/msg, "
                          f"GC {spent['seconds'] / count * 1e6:5.2f} us/msg, collections {spent['runs']}")


def broker_knows(port: int, topic: str, partitions: int) -> bool:
    """The broker has opened every partition of `topic` (raw frames to an unknown
    partition are refused, and acks=0 would not say so)."""
    with BrokerConnection("127.0.0.1", port, client_id="bench") as conn:
        try:
            return all(conn.offsets(topic, p, -1) is not None for p in range(partitions))
        except LogbusError:
            return False


def consume(zk: str, topic: str, count: int) -> float:
    with SimpleConsumer(topic, 0, zookeeper=zk, offset="smallest", fetch_size=1 << 20, max_wait_ms=100) as consumer:
        got = 0
        start = time.perf_counter()
        while got < count:
            got += len(consumer.fetch())
        return got / (time.perf_counter() - start)


def consume_before(zk: str, topic: str, count: int) -> float:
    """The consumer's read as it was before issue 25: each 1 MiB fetch decoded by
    `decode_messages` (one generator step and one `Message.__init__` a message), for
    the before/after comparison in the same run."""
    with SimpleConsumer(topic, 0, zookeeper=zk, offset="smallest", fetch_size=1 << 20, max_wait_ms=100) as consumer:
        got = 0
        start = time.perf_counter()
        while got < count:
            response = consumer._with_leader(lambda conn: conn.fetch(topic, 0, consumer.offset, 1 << 20, 100, 1))
            messages = decode_messages(response.messages, consumer.offset)[0]
            if messages:
                consumer.offset = messages[-1].next_offset
            got += len(messages)
        return got / (time.perf_counter() - start)


def _read_rate(zk: str, topic: str, count: int, read, size) -> float:
    """msg/s of `read(consumer)`'s items (`size(item)` messages each) until `count`."""
    with SimpleConsumer(topic, 0, zookeeper=zk, offset="smallest", fetch_size=1 << 20, max_wait_ms=100) as consumer:
        got = 0
        start = time.perf_counter()
        for item in read(consumer):
            got += size(item)
            if got >= count:
                break
        return got / (time.perf_counter() - start)


def consume_iterating(zk: str, topic: str, count: int) -> float:
    """Consumer iteration, a `Message` at a time (`SimpleConsumer.messages`)."""
    return _read_rate(zk, topic, count, SimpleConsumer.messages, lambda _: 1)


def consume_batches(zk: str, topic: str, count: int) -> float:
    """The batch read: whole fetches as columns (`SimpleConsumer.batches`)."""
    return _read_rate(zk, topic, count, SimpleConsumer.batches, len)


CONSUMERS = {"before: decode_messages": consume_before, "iteration": consume_iterating, "batches": consume_batches}


def consumer_rounds(rounds: int, count: int) -> None:
    """`--consumer-rounds`: one topic written once (batch 50, acks 1: magic-3 producer
    batches), then every consumer read in turn, `rounds` times, alternating."""
    with scratch_cluster("logbus-bench-clients-") as (zookeeper, cluster):
        cluster.start_broker(0, {"log.flush.interval.ms": 200, "log.flush.interval.messages": 100_000})
        with client(zookeeper.connect_string) as zk:
            create_topic(zk, "bench-read", 1)
        produce(zookeeper.connect_string, "bench-read", count, 50, 1)
        rates: dict[str, list[float]] = {name: [] for name in CONSUMERS}
        for _ in range(rounds):
            for name, read in CONSUMERS.items():
                rates[name].append(read(zookeeper.connect_string, "bench-read", count))
    print(f"{count} messages of {SIZE} bytes, one partition, 1 MiB fetches, {rounds} rounds alternating")
    for name, values in rates.items():
        print(f"consumer {name:26} " + " ".join(f"{v:10.0f}" for v in values) + " msg/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000, help="messages per producer run (default 200000)")
    parser.add_argument("--send", action="store_true", help="also acks-0 runs through send (a future a message)")
    parser.add_argument("--send-many", action="store_true", help="also the batch-50 runs through send_many")
    parser.add_argument("--against-raw", type=int, default=0,
                        help="only the Producer against bench.raw's frames at batch 1 and 50, alternating, N rounds")
    parser.add_argument("--gc-rounds", type=int, default=0,
                        help="only the Producer's rate, CPU and GC a message at --batches, N rounds")
    parser.add_argument("--batches", default="1,50", help="--gc-rounds' batch sizes (default 1,50)")
    parser.add_argument("--monitoring", action="store_true",
                        help="--gc-rounds with the producer's monitoring on (a Producer's default)")
    parser.add_argument("--consumer-rounds", type=int, default=0,
                        help="only the consumer reads (before issue 25, iteration, batches), alternating, N rounds")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.consumer_rounds:
        consumer_rounds(args.consumer_rounds, args.count)
        return
    if args.against_raw:
        against_raw(args.against_raw, args.count)
        return
    if args.gc_rounds:
        gc_rounds(args.gc_rounds, args.count, [int(b) for b in args.batches.split(",")], args.monitoring)
        return
    with scratch_cluster("logbus-bench-clients-") as (zookeeper, cluster):
        pid = cluster.start_broker(0, {"log.flush.interval.ms": 200, "log.flush.interval.messages": 100_000}).process.pid
        runs = [(f"producer batch {batch} acks {acks}", f"bench-b{batch}-a{acks}", batch, acks, "produce")
                for batch in (1, 50) for acks in (0, 1)]
        if args.send:
            runs += [(f"producer batch {batch} acks 0 send", f"bench-send-b{batch}", batch, 0, "send") for batch in (1, 50)]
        if args.send_many:
            runs += [(f"producer batch 50 acks {acks} send_many", f"bench-many-a{acks}", 50, acks, "send_many")
                     for acks in (0, 1)]
        rows = []
        with client(zookeeper.connect_string) as zk:
            for name, topic, batch, acks, call in runs:
                create_topic(zk, topic, 1)
                rate, *cpu = produce(zookeeper.connect_string, topic, args.count, batch, acks, call=call, broker_pid=pid)
                rows.append((name, rate, PAPER[f"batch {batch}"], cpu))
        rate = consume(zookeeper.connect_string, "bench-b50-a1", args.count)
        rows.append(("consumer (one partition, 1 MiB fetches)", rate, PAPER["consumer"], None))
    print(f"{args.count} messages of {SIZE} bytes per run, one broker, one partition, 2 shared cores")
    print(f"{'run':42} {'msg/s':>10} {'MB/s':>8} {'paper msg/s':>12} {'ratio':>6} {'CPU us/msg':>10} "
          f"{'broker us/msg':>13} {'broker busy':>11}")
    for name, rate, paper, cpu in rows:
        print(f"{name:42} {rate:10.0f} {rate * SIZE / 1e6:8.2f} {paper:12d} {rate / paper:6.2f}"
              + (" {:10.2f} {:13.2f} {:11.2f}".format(*cpu) if cpu is not None else ""))


if __name__ == "__main__":
    main()
