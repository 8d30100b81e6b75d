"""Raw load generator: the broker's produce and fetch paths without client overhead.

Pre-encoded PRODUCE frames (200-byte messages, batch 1 or 50, acks=0) are written
over a few connections from a separate process; the end of each connection's stream
is marked by one acks=1 request, whose answer means every earlier request on that
connection was appended. Then one connection fetches everything back from the page
cache. Starts its own ZooKeeper and broker in a temp dir.

    .venv/bin/python -m bench.raw --messages 1000000
"""

from __future__ import annotations

import argparse
import multiprocessing
import struct
import sys
import tempfile
import time
from pathlib import Path

from broker.client.connection import BrokerConnection
from broker.common.message import encode_message_set
from broker.common.protocol import ApiKey, ProduceRequest, encode_request
from harness.cluster import LocalCluster
from harness.zookeeper import ZooKeeperServer

MESSAGE_BYTES = 200
PAPER = {"produce batch 1": 50_000, "produce batch 50": 400_000, "consume": 22_000}


def produce_frames(topic: str, partition: int, batch: int, acks: int) -> bytes:
    data = encode_message_set([(None, b"m" * MESSAGE_BYTES, int(time.time() * 1000))] * batch)
    return encode_request(ApiKey.PRODUCE, 1, "bench", ProduceRequest(acks, 1000, topic, partition, data).encode())


def _producer(port: int, topic: str, partition: int, batch: int, requests: int, ready, go) -> None:
    frame = produce_frames(topic, partition, batch, 0)
    chunk = frame * max(1, 65536 // len(frame))  # many frames per sendall
    per_chunk = len(chunk) // len(frame)
    conn = BrokerConnection("127.0.0.1", port, client_id="bench").connect()
    ready.set()
    go.wait()
    sent = 0
    while sent + per_chunk <= requests:
        conn.send_frame(chunk)
        sent += per_chunk
    if requests - sent:
        conn.send_frame(frame * (requests - sent))
    conn.produce(topic, partition, encode_message_set([(None, b"end", 0)]), acks=1)  # in order: all appended
    conn.close()


def run_produce(port: int, topic: str, messages: int, batch: int, connections: int) -> float:
    requests = messages // batch // connections
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    readies, procs = [], []
    for i in range(connections):
        ready = ctx.Event()
        readies.append(ready)
        # daemonic: a failure here must not leave the exit waiting for producers that wait for `go`
        procs.append(ctx.Process(target=_producer, args=(port, topic, i, batch, requests, ready, go), daemon=True))
    for p in procs:
        p.start()
    for r in readies:
        r.wait(60)
    start = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - start
    if any(p.exitcode for p in procs):
        raise SystemExit("a producer process failed")
    return requests * batch * connections / elapsed


def run_fetch(port: int, topic: str, partitions: int, max_bytes: int) -> tuple[float, float]:
    """One connection reads every partition from offset 0 to its end: (msg/s, MB/s)."""
    conn = BrokerConnection("127.0.0.1", port, client_id="bench").connect()
    ends = [conn.offsets(topic, p, -1)[0] for p in range(partitions)]
    total_bytes = total_messages = 0
    start = time.perf_counter()
    for partition, end in enumerate(ends):
        offset = 0
        while offset < end:
            data = conn.fetch(topic, partition, offset, max_bytes).messages
            pos, n = 0, len(data)
            while n - pos >= 4:  # walk entry sizes: whole messages only
                size = struct.unpack_from(">i", data, pos)[0]
                if pos + 4 + size > n:
                    break
                pos += 4 + size
                total_messages += 1
            offset += pos
            total_bytes += pos
    elapsed = time.perf_counter() - start
    conn.close()
    return total_messages / elapsed, total_bytes / elapsed / 1e6


def wait_flushed(port: int, topic: str, partitions: int) -> None:
    conn = BrokerConnection("127.0.0.1", port).connect()
    for p in range(partitions):
        end = None
        while end is None or conn.offsets(topic, p, -1)[0] < end:
            conn.produce(topic, p, encode_message_set([(None, b"flush", 0)]), acks=-1)
            end = conn.offsets(topic, p, -1)[0]
    conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages per produce run")
    parser.add_argument("--connections", type=int, default=2, help="producer connections (one partition each)")
    parser.add_argument("--fetch-bytes", type=int, default=1 << 20, help="max_bytes of each fetch")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="logbus-bench-") as workdir:
        with ZooKeeperServer(Path(workdir) / "zk") as zk, LocalCluster(zk.connect_string + "/bench", Path(workdir)) as cluster:
            broker = cluster.start_broker(0, {"log.flush.interval.messages": 50_000, "log.flush.interval.ms": 1000})
            admin = BrokerConnection(*broker.address).connect()
            for batch in (1, 50):
                topic = f"raw-batch-{batch}"
                admin.create_topic(topic, args.connections)
                rate = run_produce(broker.port, topic, args.messages, batch, args.connections)
                rows.append((f"produce batch {batch}", rate, rate * (MESSAGE_BYTES + 22) / 1e6))
                print(f"produce batch {batch:>2}, acks=0: {rate:>10,.0f} msg/s  {rows[-1][2]:6.1f} MB/s", file=sys.stderr)
            wait_flushed(broker.port, "raw-batch-50", args.connections)
            rate, mbps = run_fetch(broker.port, "raw-batch-50", args.connections, args.fetch_bytes)
            rows.append(("consume", rate, mbps))
            admin.close()
    print(f"\n{args.messages:,} messages of {MESSAGE_BYTES} bytes, {args.connections} producer connections, "
          f"fetch max_bytes {args.fetch_bytes:,}\n")
    print("| test | msg/s | MB/s | paper msg/s | ours / paper |")
    print("|---|---:|---:|---:|---:|")
    for name, rate, mbps in rows:
        print(f"| {name} | {rate:,.0f} | {mbps:.1f} | {PAPER[name]:,} | {rate / PAPER[name]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
