"""Seeded fuzzer of the wire protocol: mutated valid frames of every api against a real
broker, with a control client checked between cases.

Each case is a fresh connection that receives one or a few frames — valid ones of
every api, then mutated: flipped bytes, extreme integers in any field, truncations,
wrong size prefixes, junk appended, frames glued together, split into random writes —
and then a half-close. The broker may answer anything or close; it must never crash,
answer only with whole frames, in request order, never to an acks=0 request (the
expected answers are worked out by framing the sent bytes as the broker must), never
disturb the control connection (whose produce and fetch are checked after every
`--check-every` cases) and never corrupt a log (every partition is read back whole,
CRCs checked, at the end). A failure prints the seed and case number that reproduce it.

    .venv/bin/python -m bench.fuzz --cases 20000 --seed 7

`tests/faults/test_wire_fuzz.py` runs a few hundred cases of the same generator.
"""

from __future__ import annotations

import argparse
import random
import socket
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from broker.client.connection import BrokerConnection
from broker.common.message import encode_message_set, iter_messages
from broker.common.protocol import (
    ApiKey, CreateTopicRequest, FetchRequest, MetadataRequest, MultiFetchRequest, MultiProduceRequest,
    OffsetsRequest, ProducePart, ProduceRequest, encode_request,
)

FUZZ_TOPIC = "fuzz"
CONTROL_TOPIC = "control"
BROKER_SETTINGS = {
    "message.max.bytes": 20_000,
    "socket.request.max.bytes": 1 << 20,  # over the 256 KiB scratch buffer: wrong sizes reach the large-frame path
    "request.read.timeout.ms": 2000,
    "num.partitions": 1,
    "auto.create.topics": "true",
    "fetch.max.wait.ms": 500,
}
_INTERESTING = [0, 1, -1, 2, 127, -128, 255, 256, 32767, -32768, 65535, 2**31 - 1, -(2**31), 2**31 - 2]


def _message_set(rng: random.Random) -> bytes:
    n = rng.randint(1, 4)
    return encode_message_set(
        [(rng.choice([None, b"k"]), rng.randbytes(rng.randint(0, 300)), rng.randint(0, 2**41)) for _ in range(n)],
    )


def valid_body(rng: random.Random, api: ApiKey) -> bytes:
    """A well-formed request body of `api` aimed at the fuzz topic."""
    if api == ApiKey.PRODUCE:
        return ProduceRequest(rng.choice([0, 1, -1]), 1000, FUZZ_TOPIC, rng.choice([0, 0, -1]), _message_set(rng)).encode()
    if api == ApiKey.FETCH:
        return FetchRequest(FUZZ_TOPIC, 0, rng.choice([0, 0, 10, 2**40]), rng.randint(0, 1 << 16), rng.choice([0, 50]),
                            rng.choice([0, 1])).encode()
    if api == ApiKey.MULTIFETCH:
        return MultiFetchRequest([FetchRequest(FUZZ_TOPIC, 0, 0, 4096, rng.choice([0, 50]), 1)
                                  for _ in range(rng.randint(0, 3))]).encode()
    if api == ApiKey.MULTIPRODUCE:
        parts = [ProducePart(FUZZ_TOPIC, 0, _message_set(rng)) for _ in range(rng.randint(1, 3))]
        return MultiProduceRequest(rng.choice([0, 1, -1]), 1000, parts).encode()
    if api == ApiKey.OFFSETS:
        return OffsetsRequest(FUZZ_TOPIC, 0, rng.choice([-1, -2, 0, 2**40]), rng.randint(1, 5)).encode()
    if api == ApiKey.METADATA:
        return MetadataRequest(rng.choice([[], [FUZZ_TOPIC], ["no-such"], ["bad name"]])).encode()
    return CreateTopicRequest(f"fz-{rng.randint(0, 20)}", rng.choice([1, 2, -1]), 1).encode()


def _mutate(rng: random.Random, frame: bytearray) -> bytearray:
    kind = rng.randrange(9)
    if kind == 0 and len(frame) > 4:  # flip bytes anywhere after the size prefix
        for _ in range(rng.randint(1, 4)):
            frame[rng.randrange(4, len(frame))] ^= 1 << rng.randrange(8)
    elif kind == 1 and len(frame) > 8:  # an extreme value in some int field
        width, fmt = rng.choice([(1, ">b"), (2, ">h"), (4, ">i"), (8, ">q")])
        at = rng.randrange(4, max(5, len(frame) - width))
        lo, hi = -(1 << (8 * width - 1)), (1 << (8 * width - 1)) - 1
        value = min(max(rng.choice(_INTERESTING + [rng.randint(lo, hi)]), lo), hi)
        frame[at : at + width] = struct.pack(fmt, value)
    elif kind == 2:  # truncate the body, keeping the size prefix honest
        cut = rng.randrange(4, len(frame) + 1)
        del frame[cut:]
        struct.pack_into(">i", frame, 0, len(frame) - 4)
    elif kind == 3:  # truncate, leaving the size prefix promising more
        del frame[rng.randrange(0, len(frame)) :]
    elif kind == 4:  # a wrong size prefix
        struct.pack_into(">i", frame, 0, rng.choice(_INTERESTING + [rng.randint(-(2**31), 2**31 - 1)]))
    elif kind == 5:  # junk appended inside the frame
        frame += rng.randbytes(rng.randint(1, 64))
        struct.pack_into(">i", frame, 0, len(frame) - 4)
    elif kind == 6:  # wrong api key or version
        struct.pack_into(">hh", frame, 4, rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 99, -1]), rng.choice([0, 0, 1, -1]))
    elif kind == 7:  # a string length gone wrong (client_id's)
        struct.pack_into(">h", frame, 12, rng.choice([-1, -2, 0, 3, 1000, 32767]))
    else:  # random garbage of a random length
        frame[:] = rng.randbytes(rng.randint(0, 40))
    return frame


@dataclass
class Case:
    """One connection's worth of bytes, and how to cut it into writes."""

    data: bytes
    writes: list[int] = field(default_factory=list)
    apis: list[str] = field(default_factory=list)


def make_case(seed: int, number: int) -> Case:
    """Case `number` of `seed`: deterministic, so a failure can be replayed alone."""
    rng = random.Random(f"{seed}/{number}")
    data = bytearray()
    apis = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        api = rng.choice(list(ApiKey))
        frame = bytearray(encode_request(api, rng.randint(0, 2**31 - 1), rng.choice(["fuzz", "", "x" * 40]),
                                         valid_body(rng, api)))
        if rng.random() < 0.8:
            frame = _mutate(rng, frame)
        data += frame
        apis.append(api.name)
    writes = []
    if rng.random() < 0.3:  # split into random writes
        left = len(data)
        while left > 0:
            writes.append(min(left, rng.randint(1, 64)))
            left -= writes[-1]
    return Case(bytes(data), writes, apis)


def answerable(data: bytes, limit: int) -> list[tuple[int, bool]]:
    """Frame the bytes as the broker must: (correlation_id, may be answered) for every
    complete frame it dispatches, stopping where it must close the connection. acks=0
    PRODUCE/MULTIPRODUCE requests may never be answered."""
    out: list[tuple[int, bool]] = []
    pos = 0
    while len(data) - pos >= 4:
        (size,) = struct.unpack_from(">i", data, pos)
        if size > limit and len(data) - pos >= 12:  # RequestTooLarge, then closed
            out.append((struct.unpack_from(">i", data, pos + 8)[0], True))
            break
        if size < 10 or size > limit or len(data) - pos - 4 < size:
            break
        frame = data[pos + 4 : pos + 4 + size]
        pos += 4 + size
        api_key, api_version, correlation_id, client_len = struct.unpack_from(">hhih", frame)
        body = 10 + max(client_len, 0)
        if client_len < -1 or body > size:
            break  # unreadable header: closed
        if api_key in (ApiKey.PRODUCE, ApiKey.MULTIPRODUCE) and api_version == 0:
            if body >= size:
                break  # acks unreadable: closed
            out.append((correlation_id, frame[body] != 0))
        else:
            out.append((correlation_id, True))
    return out


def check_answers(case: Case, answer: bytes, limit: int) -> None:
    """Answers are whole frames, in request order, and never to an acks=0 request."""
    expected = iter(answerable(case.data, limit))
    pos = 0
    while pos < len(answer):
        if len(answer) - pos < 10:
            raise AssertionError(f"a partial answer frame of {len(answer) - pos} bytes")
        size, correlation_id = struct.unpack_from(">ii", answer, pos)
        if size < 6 or len(answer) - pos - 4 < size:
            raise AssertionError(f"an answer frame of impossible size {size}")
        pos += 4 + size
        for expected_id, may_answer in expected:
            if expected_id == correlation_id and may_answer:
                break
        else:
            raise AssertionError(f"answer to correlation id {correlation_id} out of order, unasked for, or to acks=0")


def run_case(address: tuple[str, int], case: Case, timeout: float = 10.0, limit: int | None = None) -> int:
    """Send the case, half-close, read until the broker closes. Returns bytes answered;
    raises TimeoutError if the broker neither answers nor closes within `timeout`, and
    AssertionError if the answers break the contract (`check_answers`, given `limit`,
    the broker's socket.request.max.bytes)."""
    with socket.create_connection(address, timeout=timeout) as sock:
        try:
            if case.writes:
                pos = 0
                for n in case.writes:
                    sock.sendall(case.data[pos : pos + n])
                    pos += n
            else:
                sock.sendall(case.data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # broken pipe, reset, not connected: the broker closed first, which is allowed
            return 0
        received = bytearray()
        deadline = time.monotonic() + timeout
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break  # a reset may lose answers in flight: check what came
            except socket.timeout:
                chunk = None
            if not chunk:
                if chunk is None or time.monotonic() > deadline:
                    raise TimeoutError("the broker neither answered nor closed")
                break
            received += chunk
    if limit is not None:
        check_answers(case, bytes(received), limit)
    return len(received)


class Control:
    """The well-behaved client whose service must not be disturbed."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.conn = BrokerConnection(*address, client_id="control", timeout=30).connect()
        self.conn.create_topic(CONTROL_TOPIC, 1)
        self.values: list[bytes] = []
        self.worst_wait = 0.0

    def check(self, label: str) -> None:
        """Produce one message (acks=-1) and fetch it back at the offset produced."""
        value = f"control {len(self.values)} {label}".encode()
        start = time.monotonic()
        result = self.conn.produce(CONTROL_TOPIC, 0, encode_message_set([(None, value, 1)]), acks=-1)
        fetched = [m.value for m in iter_messages(self.conn.fetch(CONTROL_TOPIC, 0, result.base_offset).messages,
                                                    result.base_offset)]
        self.worst_wait = max(self.worst_wait, time.monotonic() - start)
        if fetched[:1] != [value]:
            raise AssertionError(f"control read {fetched[:1]} at {result.base_offset} after {label}, expected {value}")
        self.values.append(value)

    def verify_logs(self) -> int:
        """Every control message in order, and the fuzz topic's log readable to its end
        with every CRC right. Returns the fuzz topic's message count."""
        read = [m.value for m in read_all(self.conn, CONTROL_TOPIC)]
        if read != self.values:
            raise AssertionError(f"control log holds {len(read)} messages, expected {len(self.values)} in order")
        return len(read_all(self.conn, FUZZ_TOPIC))

    def close(self) -> None:
        self.conn.close()


def read_all(conn: BrokerConnection, topic: str) -> list:
    end = conn.offsets(topic, 0, -1)[0]
    messages, offset = [], 0
    while offset < end:
        batch = list(iter_messages(conn.fetch(topic, 0, offset, 1 << 20).messages, offset))
        if not batch:
            raise AssertionError(f"{topic}-0 cannot be read past offset {offset} (end {end})")
        messages += batch
        offset = batch[-1].next_offset
    return messages


@dataclass
class Report:
    cases: int = 0
    answered: int = 0
    closed_silently: int = 0
    crashes: int = 0
    control_worst_wait: float = 0.0
    fuzz_messages: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        return (f"{self.cases} cases in {self.seconds:.1f}s: {self.answered} answered, {self.closed_silently} closed "
                f"without an answer; crashes {self.crashes}; control worst wait {self.control_worst_wait * 1000:.0f} ms; "
                f"fuzz topic holds {self.fuzz_messages} readable messages")


def fuzz(broker, seed: int, cases: int, check_every: int = 1) -> Report:
    """Run `cases` cases against a started `BrokerProcess`; raise at the first fault."""
    report = Report()
    start = time.monotonic()
    control = Control(broker.address)
    control.check("start")
    try:
        for number in range(cases):
            case = make_case(seed, number)
            label = f"seed {seed} case {number} ({'+'.join(case.apis)}, {len(case.data)} bytes)"
            try:
                answered = run_case(broker.address, case, limit=int(BROKER_SETTINGS["socket.request.max.bytes"]))
            except (TimeoutError, AssertionError) as exc:
                raise AssertionError(f"{label}: {exc}") from None
            except OSError as exc:  # refused connection: is the broker still there?
                if not broker.alive:
                    report.crashes += 1
                    raise AssertionError(f"broker died at {label}:\n{broker.log_tail()}") from None
                raise AssertionError(f"{label}: {exc}") from None
            if not broker.alive:
                report.crashes += 1
                raise AssertionError(f"broker died at {label}:\n{broker.log_tail()}")
            report.cases += 1
            if answered:
                report.answered += 1
            else:
                report.closed_silently += 1
            if (number + 1) % check_every == 0:
                control.check(label)
        control.check("end")
        report.fuzz_messages = control.verify_logs()
        report.control_worst_wait = control.worst_wait
    finally:
        control.close()
        report.seconds = time.monotonic() - start
    return report


def main(argv: list[str] | None = None) -> int:
    from harness.cluster import LocalCluster
    from harness.zookeeper import ZooKeeperServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--check-every", type=int, default=10, help="cases between control produce+fetch checks")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="logbus-fuzz-") as workdir:
        with ZooKeeperServer(Path(workdir) / "zk") as zk, \
                LocalCluster(zk.connect_string + "/fuzz", Path(workdir)) as cluster:
            broker = cluster.start_broker(0, BROKER_SETTINGS)
            with BrokerConnection(*broker.address).connect() as admin:
                admin.create_topic(FUZZ_TOPIC, 1)
            print(f"fuzzing with seed {args.seed}, {args.cases} cases", file=sys.stderr)
            try:
                report = fuzz(broker, args.seed, args.cases, args.check_every)
            except AssertionError as exc:
                print(f"FAILED: {exc}", file=sys.stderr)
                return 1
            print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
