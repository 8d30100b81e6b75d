"""A broker's recovery after kill -9, and what the entry index costs (not a test;
docs/storage.md, "Entry index").

One broker, one partition of `--size` GB (10^9 bytes) in one segment (the segment
size is the default 1 GiB, so recovery scans all of it): written as sets of `--batch` plain
200-byte messages, acks=0, over one connection (bench.raw's frames), flushed; then
SIGKILL and a start: the recovery time is from the start to the broker's "loaded N
partitions" line. Then the bytes on disk per message (segment files and their
sidecars), and the cost of FETCH version 1 at an entry boundary against one at a
record inside an entry: a second topic of `--fetch-mib` MiB of idempotent producer
batches of 50 (a record inside a batch is what a Kafka reader asks for next), each
fetch at a random batch, `--fetches` of each, latency medians over one connection.

    .venv/bin/python -m bench.recovery --size 1
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from bench.raw import produce_frames
from bench.scale import logs_loaded_at
from broker.client.connection import BrokerConnection
from broker.common.message import BatchIdentity, encode_batch, encode_message_set, now_ms
from harness.cluster import scratch_cluster

MESSAGE = b"m" * 200


def fill(conn: BrokerConnection, topic: str, size: int, batch: int) -> int:
    """Write plain sets of `batch` messages until the partition holds `size` bytes;
    returns the messages written."""
    frame = produce_frames(topic, 0, batch, 0)
    frames = max(1, (1 << 20) // len(frame))
    per_frame = len(encode_message_set([(None, MESSAGE, 0)] * batch))
    written = 0
    while written * per_frame < size:
        conn.send_frame(frame * frames)
        written += frames
    conn.produce(topic, 0, encode_message_set([(None, b"end", now_ms())]), acks=-1)  # in order: all appended
    return written * batch + 1


def fill_batches(conn: BrokerConnection, topic: str, size: int) -> list[int]:
    """Idempotent batches of 50 until `size` bytes; their offsets."""
    producer_id = conn.init_producer_id().producer_id
    offsets, sequence = [], 0
    while not offsets or conn.offsets(topic, 0, -1)[0] < size:
        for _ in range(100):
            data = encode_batch([(None, MESSAGE, now_ms())] * 50, BatchIdentity(producer_id, 0, sequence, 50))
            offsets.append(conn.produce(topic, 0, data, acks=1).base_offset)
            sequence += 50
        conn.produce(topic, 0, encode_message_set([(None, b"flush", now_ms())]), acks=-1)
    return offsets


def fetch_ms(conn: BrokerConnection, topic: str, offsets: list[int], inside: bool, fetches: int) -> float:
    """Median milliseconds of FETCH version 1 at random batches' starts or records."""
    rng = random.Random(7)
    times = []
    for _ in range(fetches):
        offset = rng.choice(offsets) + (rng.randrange(1, 50) if inside else 0)
        start = time.perf_counter()
        answer = conn.fetch(topic, 0, offset, 64 << 10)
        times.append(time.perf_counter() - start)
        assert getattr(answer, "set_offset", offset) <= offset and len(answer.messages)
    return statistics.median(times) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=float, default=1.0, help="GB (10^9 bytes, below a segment's 1 GiB) that recovery scans")
    parser.add_argument("--batch", type=int, default=50, help="plain messages per produced set")
    parser.add_argument("--fetch-mib", type=int, default=64, help="MiB of producer batches for the fetch costs")
    parser.add_argument("--fetches", type=int, default=300, help="fetches of each kind")
    args = parser.parse_args(argv)
    size = int(args.size * 1e9)
    with scratch_cluster("logbus-bench-recovery-", {"log.flush.interval.ms": 200}) as (_, cluster):
        broker = cluster.start_broker(0)
        with BrokerConnection(*broker.address, timeout=600).connect() as conn:
            conn.create_topic("recovered", 1)
            conn.create_topic("fetched", 1)
            t0 = time.perf_counter()
            messages = fill(conn, "recovered", size, args.batch)
            batches = fill_batches(conn, "fetched", args.fetch_mib << 20)
            print(f"wrote {messages:,} messages in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        broker.kill()
        t0 = time.time()
        broker.start(timeout=1800)
        recovery = logs_loaded_at(broker.log_path) - t0
        directory = broker.log_dir / "recovered-0"
        data = sum(p.stat().st_size for p in directory.glob("*.kafka"))
        with BrokerConnection(*broker.address, timeout=600).connect() as conn:
            boundary = fetch_ms(conn, "fetched", batches, False, args.fetches)
            inside = fetch_ms(conn, "fetched", batches, True, args.fetches)
        broker.stop()  # a clean stop writes the sidecars of the active segments
        sidecars = sum(p.stat().st_size for p in directory.iterdir() if p.suffix != ".kafka")
        t0 = time.time()
        broker.start(timeout=1800)
        clean = logs_loaded_at(broker.log_path) - t0
    print(f"\n{data / 1e9:.2f} GB, {messages:,} messages of 200 bytes in sets of {args.batch}\n")
    print("| measure | value |")
    print("|---|---:|")
    print(f"| recovery after kill -9 (start to logs loaded) | {recovery:.2f} s |")
    print(f"| start after a clean stop (start to logs loaded) | {clean:.2f} s |")
    print(f"| bytes on disk per message: data | {data / messages:.2f} |")
    print(f"| bytes on disk per message: sidecars (index, timestamps) | {sidecars / messages:.3f} |")
    print(f"| FETCH v1 at a batch's start (median ms) | {boundary:.3f} |")
    print(f"| FETCH v1 at a record inside a batch (median ms) | {inside:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
