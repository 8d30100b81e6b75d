"""A broker's recovery after kill -9, and what the entry index costs (not a test;
docs/storage.md, "Entry index").

One broker, one partition of `--size` GB (10^9 bytes), in segments of `--segment-mib`
MiB (the default 1 GiB keeps it in one segment, so recovery scans all of it): written as
sets of `--batch` plain 200-byte messages, acks=0, over one connection (bench.raw's
frames), flushed; then SIGKILL and a start, twice: first with the sealed segments'
`.index` sidecars as the broker left them, then with every `.index` deleted (the
broker must rebuild them). Each start gives the time to the broker's "loaded N
partitions" line and to its being ready (registered in ZooKeeper, which waits for the
killed broker's session to go), then how long its first FETCH at an entry in the
middle of the oldest segment takes, and (with RECORD_COUNT, after record offsets) how
long counting every record of the partition then takes — which needs every segment's
index: loaded from its sidecar, or rebuilt. Then the bytes on disk per message
(segment files and their sidecars, after a clean stop), and the cost of FETCH version
1 at an entry boundary against one at a record inside an entry: a second topic of
`--fetch-mib` MiB of idempotent producer batches of 50 (a record inside a batch is what
a Kafka reader asks for next), each fetch at a random batch, `--fetches` of each,
latency medians over one connection. `--fetch-mib 0` leaves that out; the rest also
runs against the code before record offsets (`PYTHONPATH=<old tree> python
bench/recovery.py ...`, this file run by its path).

    .venv/bin/python -m bench.recovery --size 1
    .venv/bin/python -m bench.recovery --size 1 --segment-mib 128 --fetch-mib 0
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time

from bench.raw import produce_frames
from bench.scale import logs_loaded_at
from broker.client.connection import BrokerConnection, LogbusError
from broker.common.message import BatchIdentity, encode_batch, encode_message_set, now_ms
from harness.cluster import scratch_cluster
from harness.process import wait_until

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


def answer_times(broker, messages: int, middle: int) -> tuple[float, float, float, float]:
    """kill -9 and a start: seconds from the start to the logs loaded and to the broker
    ready (registered: it waits for its killed session's node to go), then the first
    FETCH at `middle` (an entry start in the oldest segment) and RECORD_COUNT over the
    whole partition (nan before record offsets), each timed alone."""
    broker.kill()
    t0 = time.time()
    broker.start(timeout=1800)
    ready = time.time() - t0
    loaded = logs_loaded_at(broker.log_path) - t0
    with BrokerConnection(*broker.address, timeout=1800).connect() as conn:
        start = time.perf_counter()
        answer = wait_until(lambda: _fetched(conn, middle), 600, "the partition's first answer")
        fetched = time.perf_counter() - start
        assert getattr(answer, "set_offset", middle) == middle and len(answer.messages), "a wrong answer"
        if not hasattr(conn, "record_count"):
            return loaded, ready, fetched, math.nan
        start = time.perf_counter()
        counted = conn.record_count("recovered", 0, 0).records
        assert counted == messages, f"RECORD_COUNT {counted}, {messages} written"
        return loaded, ready, fetched, time.perf_counter() - start


def _fetched(conn: BrokerConnection, offset: int):
    try:
        return conn.fetch("recovered", 0, offset, 64 << 10)
    except LogbusError:  # the partition not led yet
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=float, default=1.0, help="GB (10^9 bytes) of the partition")
    parser.add_argument("--segment-mib", type=int, default=1024, help="segment size (log.segment.bytes), MiB")
    parser.add_argument("--batch", type=int, default=50, help="plain messages per produced set")
    parser.add_argument("--fetch-mib", type=int, default=64, help="MiB of producer batches for the fetch costs (0: none)")
    parser.add_argument("--fetches", type=int, default=300, help="fetches of each kind")
    args = parser.parse_args(argv)
    size, segment = int(args.size * 1e9), args.segment_mib << 20
    settings = {"log.flush.interval.ms": 200, "log.segment.bytes": segment}
    rows = []
    with scratch_cluster("logbus-bench-recovery-", settings) as (_, cluster):
        broker = cluster.start_broker(0)
        with BrokerConnection(*broker.address, timeout=600).connect() as conn:
            conn.create_topic("recovered", 1)
            t0 = time.perf_counter()
            messages = fill(conn, "recovered", size, args.batch)
            if args.fetch_mib:
                conn.create_topic("fetched", 1)
                batches = fill_batches(conn, "fetched", args.fetch_mib << 20)
            print(f"wrote {messages:,} messages in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        directory = broker.log_dir / "recovered-0"
        set_bytes = len(encode_message_set([(None, MESSAGE, 0)] * args.batch))
        middle = min(segment, size) // 2 // set_bytes * set_bytes  # sets are alike: a set's start
        for case in ("sidecars kept", "sidecars deleted"):
            if case == "sidecars deleted":
                broker.kill()  # the sidecars are deleted with the broker down
                for sidecar in directory.glob("*.index"):
                    sidecar.unlink()
            rows.append((case, *answer_times(broker, messages, middle), len(list(directory.glob("*.index")))))
        if args.fetch_mib:
            with BrokerConnection(*broker.address, timeout=600).connect() as conn:
                boundary = fetch_ms(conn, "fetched", batches, False, args.fetches)
                inside = fetch_ms(conn, "fetched", batches, True, args.fetches)
        broker.stop()  # a clean stop writes the sidecars of the active segments
        data = sum(p.stat().st_size for p in directory.glob("*.kafka"))
        sidecars = {suffix: sum(p.stat().st_size for p in directory.glob("*" + suffix)) for suffix in (".index", ".meta")}
        t0 = time.time()
        broker.start(timeout=1800)
        clean = logs_loaded_at(broker.log_path) - t0
    segments = math.ceil(data / segment)
    print(f"\n{data / 1e9:.2f} GB in {segments} segment(s) of {args.segment_mib} MiB, {messages:,} messages of 200 bytes "
          f"in sets of {args.batch}\n")
    print("| measure | value |")
    print("|---|---:|")
    for case, loaded, ready, fetched, counted, indexes in rows:
        print(f"| recovery after kill -9, {case}: start to logs loaded | {loaded:.2f} s |")
        print(f"| recovery after kill -9, {case}: start to ready (registered) | {ready:.2f} s |")
        print(f"| recovery after kill -9, {case}: then a FETCH in the oldest segment | {fetched:.3f} s |")
        print(f"| recovery after kill -9, {case}: then RECORD_COUNT of the partition | {counted:.3f} s |")
        print(f"| recovery after kill -9, {case}: .index sidecars at the end | {indexes} |")
    print(f"| start after a clean stop (start to logs loaded) | {clean:.2f} s |")
    print(f"| bytes on disk per message: data | {data / messages:.2f} |")
    print(f"| bytes on disk per message: index sidecars | {sidecars['.index'] / messages:.3f} |")
    print(f"| bytes on disk per message: timestamp sidecars | {sidecars['.meta'] / messages:.4f} |")
    if args.fetch_mib:
        print(f"| FETCH v1 at a batch's start (median ms) | {boundary:.3f} |")
        print(f"| FETCH v1 at a record inside a batch (median ms) | {inside:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
