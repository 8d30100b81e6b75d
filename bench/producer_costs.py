"""The producer's Python a message, in one thread without a broker (not a test; issue
38): what the caller's `RecordAccumulator.append` (the path `Producer.produce` ends in)
and the sender's `encode_message_set` cost per 200-byte message at batch 50, against
the C calls neither can avoid, and against the issue's idea of a batch encoded as it is
appended into one buffer (no tuple a message, nothing left for the sender to encode).
Alternating rounds; min and median in ns a message.

    .venv/bin/python -m bench.producer_costs --messages 500000 --rounds 9

The rows say where a pure-Python producer's floor is: the Producer in `bench.clients`
spends about this sum (plus `produce`'s own frame, the sender's rounds and the socket)
a message, and its process runs on one core at a time (the GIL).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Callable

from broker.client.accumulator import RecordAccumulator
from broker.common.encoding import encode_message_set
from broker.common.entry import HEADER, HEADER_SIZE, MAGIC, V2_SEEDS, checksum

VALUE = b"x" * 200
BATCH = 50
TIMESTAMP = 1_700_000_000_000


class _OnePartition:
    """The metadata an accumulator asks for a sticky partition: one, led by broker 0."""

    def partitions(self, topic: str) -> dict[int, int]:
        return {0: 0}


class EncodedAsAppended:
    """The alternative measured: each message encoded, under the lock, at the end of its
    batch's one bytearray (magic-2 entries, as `encode_message_set` writes them), so a
    full batch is its set. Keyless messages only; enough to measure, not a producer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], list] = {}  # [buffer, count, timestamp, CRC of the header's tail]
        self.ready: list[bytearray] = []

    def append(self, topic: str, value: bytes, timestamp: int, partition: int) -> None:
        lock = self._lock
        lock.acquire()
        try:
            batch = self._open.get((topic, partition))
            if batch is None:
                batch = self._open[(topic, partition)] = [bytearray(), 0, None, 0]
            if timestamp != batch[2]:
                batch[2], batch[3] = timestamp, checksum(HEADER.pack(0, 0, 0, 0, timestamp, -1)[10:], V2_SEEDS[0])
            buffer = batch[0]
            buffer += HEADER.pack(len(value) + HEADER_SIZE - 4, MAGIC, 0, checksum(value, batch[3]), timestamp, -1)
            buffer += value
            batch[1] += 1
            if batch[1] == BATCH:
                del self._open[(topic, partition)]
                self.ready.append(buffer)
        finally:
            lock.release()


def append_and_encode(messages: int) -> tuple[float, float]:
    """ns a message of `append` (as `produce` calls it: explicit partition, no future),
    then of encoding the full batches."""
    accumulator = RecordAccumulator(_OnePartition(), batch_size=BATCH, batch_bytes=1 << 20, linger=0.005,
                                    queue_size=1 << 40)
    append, clock = accumulator.append, time.process_time
    start = clock()
    for _ in range(messages):
        append("t", None, VALUE, TIMESTAMP, 0, False)
    appended = clock()
    batches = []
    while drained := accumulator.drain(time.monotonic(), lambda topic: {0: 0}):  # not timed: the sender's round
        batches += [batch for batch, _ in drained]
    assert sum(batch.count for batch in batches) == messages
    encoding = clock()
    for batch in batches:
        encode_message_set(batch.messages())
    return (appended - start) / messages * 1e9, (clock() - encoding) / messages * 1e9


def encoded_as_appended(messages: int) -> float:
    """ns a message of the alternative, its sets copied out as the sender would."""
    batches = EncodedAsAppended()
    append, clock = batches.append, time.process_time
    start = clock()
    for _ in range(messages):
        append("t", VALUE, TIMESTAMP, 0)
    for buffer in batches.ready:
        bytes(buffer)
    return (clock() - start) / messages * 1e9


def floor(calls: int) -> dict[str, float]:
    """ns a call of what a message needs at least: the lock's pair, a tuple into a list,
    the CRC (of 200 bytes, and of none: the call alone) and the header's pack."""
    lock, records, seed, empty = threading.Lock(), [], V2_SEEDS[0], b""
    rows: dict[str, Callable[[], object]] = {
        "lock acquire + release": lambda: (lock.acquire(), lock.release()),
        "a tuple into a list": lambda: records.append((None, VALUE, TIMESTAMP)),
        "crc32c of 200 bytes": lambda: checksum(VALUE, seed),
        "crc32c of no bytes": lambda: checksum(empty, seed),
        "header pack (6 fields)": lambda: HEADER.pack(218, MAGIC, 0, 7, TIMESTAMP, -1),
        "an empty call": lambda: None,
    }
    result = {}
    for name, call in rows.items():
        start = time.process_time()
        for _ in range(calls):
            call()
        result[name] = (time.process_time() - start) / calls * 1e9
        records.clear()
    empty_call = result["an empty call"]
    return {name: ns - empty_call for name, ns in result.items() if name != "an empty call"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    messages = args.messages - args.messages % BATCH or BATCH
    rows: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        appended, encoded = append_and_encode(messages)
        for name, ns in (("caller: RecordAccumulator.append", appended), ("sender: encode_message_set", encoded),
                         ("append + encode", appended + encoded),
                         ("encoded as appended (the alternative)", encoded_as_appended(messages)),
                         *((f"floor: {name}", ns) for name, ns in floor(messages).items())):
            rows.setdefault(name, []).append(ns)
    print(f"{messages} messages of {len(VALUE)} bytes, batch {BATCH}, {args.rounds} rounds alternating, ns a message")
    for name, values in rows.items():
        print(f"{name:40} min {min(values):6.0f} median {statistics.median(values):6.0f}")


if __name__ == "__main__":
    main()
