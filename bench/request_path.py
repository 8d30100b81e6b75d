"""The broker's CPU per PRODUCE request, in one process (not a test; issue 38): a real
`Broker` (its ZooKeeper registration, `RequestHandler`, logs in a temp directory) and a
real `Connection` on one end of a loopback TCP connection, fed pre-encoded PRODUCE frames of
200-byte messages exactly as the event loop feeds a socket read (`get_buffer`, copy,
`buffer_updated`), 64 KiB a read — what `bench.raw`'s producers send. The clock is the
thread's CPU time (`time.thread_time`), so other processes on the machine inflate the
figure far less than they do wall-clock throughput (but not nothing: the two vCPUs
may share a core); acks=1 answers are read from the client's end between reads. Min and median of
`--rounds`, µs per request, for batch 1 and 50 at acks 0 and 1. Run it in two trees,
alternating, to compare them.

    .venv/bin/python -m bench.request_path --requests 20000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from broker.common.message import encode_message_set
from broker.common.protocol import ApiKey, ProduceRequest, encode_request
from harness.inprocess import FedBroker, create_topic, feed, fed_broker
from harness.zookeeper import ZooKeeperServer

MESSAGE_BYTES = 200
READ_BYTES = 64 * 1024  # one socket read's worth of frames
SETTLE_SECONDS = 3.0  # rounds right after the start measured up to twice the later ones (its background threads)
CASES = ((1, 0), (1, 1), (50, 0), (50, 1))  # (batch, acks)


def set_bytes(batch: int) -> int:
    return batch * (MESSAGE_BYTES + 22)


def frames(topic: str, batch: int, acks: int, requests: int) -> bytes:
    """`requests` PRODUCE frames, one partition, distinct correlation ids."""
    data = encode_message_set([(None, b"m" * MESSAGE_BYTES, int(time.time() * 1000))] * batch)
    body = ProduceRequest(acks, 1000, topic, 0, data).encode()
    return b"".join(encode_request(ApiKey.PRODUCE, i, "bench", body) for i in range(requests))


def drain(peer: socket.socket) -> int:
    """Read whatever answers are waiting at the client's end; the bytes read."""
    total = 0
    while True:
        try:
            chunk = peer.recv(1 << 20)
        except BlockingIOError:
            return total
        if not chunk:
            raise SystemExit("the broker closed the connection")
        total += len(chunk)


def timed_feed(fed: FedBroker, stream: bytes) -> float:
    """Hand `stream` to the connection 64 KiB a read: the thread's CPU seconds (the
    answers read at the client's end between reads included: a recv per read)."""
    start = time.thread_time()
    feed(fed.conn, stream, READ_BYTES, lambda: drain(fed.peer))
    return time.thread_time() - start


async def measure(workdir: Path, zookeeper: str, requests: int, rounds: int,
                  cases: tuple[tuple[int, int], ...] = CASES) -> dict[tuple[int, int], list[float]]:
    settings = {"log.flush.interval.messages": str(1 << 40), "log.flush.interval.ms": str(3_600_000),
                "num.partitions": "1"}
    async with fed_broker(zookeeper + "/bench", workdir, settings) as fed:
        fed.peer.setblocking(False)
        results: dict[tuple[int, int], list[float]] = {case: [] for case in cases}
        for batch, acks in cases:
            await create_topic(fed.broker, f"path-{batch}-{acks}")
        await asyncio.sleep(SETTLE_SECONDS)
        for _ in range(rounds):
            for batch, acks in cases:
                count = requests if batch == 1 else max(1, requests // 10)
                stream = frames(f"path-{batch}-{acks}", batch, acks, count)  # not timed
                log = fed.broker.handler.logs.get(f"path-{batch}-{acks}", 0)
                end = log.end_offset
                cpu = timed_feed(fed, stream)
                if log.end_offset - end != count * set_bytes(batch):  # refused requests would be measured too
                    raise SystemExit(f"batch {batch} acks {acks}: {count} requests appended "
                                     f"{log.end_offset - end} bytes, not {count * set_bytes(batch)}")
                results[(batch, acks)].append(cpu / count * 1e6)
                await asyncio.sleep(0)  # let the loop run what the requests scheduled (flush timers)
        return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000,
                        help="requests per round at batch 1 (batch 50: a tenth)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--case", action="append", metavar="BATCH:ACKS",
                        help="only these (a profile's); default all four")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the broker's stop logs a lost ZooKeeper session: expected here
    with tempfile.TemporaryDirectory(prefix="logbus-bench-path-") as workdir:
        with ZooKeeperServer(Path(workdir) / "zk") as zk:
            cases = tuple(tuple(map(int, c.split(":"))) for c in args.case) if args.case else CASES
            results = asyncio.run(measure(Path(workdir), zk.connect_string, args.requests, args.rounds, cases))
    for (batch, acks), values in results.items():
        print(f"produce batch {batch:>2} acks {acks} min {min(values):7.2f} median {statistics.median(values):7.2f} "
              f"us/request  ({', '.join(f'{v:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
