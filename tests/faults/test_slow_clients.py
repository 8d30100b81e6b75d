"""Slow and greedy clients: a trickling frame, an absurd announcement, connections
holding large partial frames, and a client that pipelines without reading. The broker
must stay within a memory bound and keep serving other clients; figures are printed
(run with -s to see them), timings are never asserted."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from broker.client.connection import BrokerConnection
from broker.common.message import encode_message_set, iter_messages
from broker.common.protocol import ApiKey, MetadataRequest, ProduceRequest, encode_request
from harness.cluster import BrokerProcess

MiB = 1 << 20


def rss_mb(broker: BrokerProcess) -> float:
    for line in Path(f"/proc/{broker.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except (TimeoutError, BlockingIOError):
        return False


def served(broker: BrokerProcess, topic: str = "other") -> float:
    """Another client's produce (acks=1) and fetch; returns how long it took."""
    start = time.monotonic()
    with BrokerConnection(*broker.address, client_id="other", timeout=120).connect() as conn:
        result = conn.produce(topic, 0, encode_message_set([(None, b"still served", 1)]), acks=-1)
        data = conn.fetch(topic, 0, result.base_offset).messages
        assert [m.value for m in iter_messages(data, result.base_offset)] == [b"still served"]
    return time.monotonic() - start


def send_until_stalled(sock: socket.socket, data: bytes, stall: float = 2.0, budget: float = 20.0) -> int:
    """Send as much of `data` as the broker accepts; stop when it stops reading."""
    sock.settimeout(stall)
    sent, view, deadline = 0, memoryview(data), time.monotonic() + budget
    try:
        while sent < len(data) and time.monotonic() < deadline:
            sent += sock.send(view[sent : sent + MiB])
    except (TimeoutError, BlockingIOError):
        pass
    except OSError:
        pass  # closed by the broker
    return sent


@pytest.fixture
def broker(cluster):
    broker = cluster.start_broker(0, {"request.read.timeout.ms": 2000})
    with BrokerConnection(*broker.address).connect() as admin:
        admin.create_topic("other", 1)
    return broker


def test_trickling_frame_is_closed_at_its_deadline(broker):
    """One byte every 0.3 s used to reset the timer forever."""
    sock = socket.create_connection(broker.address, timeout=0.3)
    start = time.monotonic()
    sock.sendall(struct.pack(">i", 100))
    closed = False
    while not closed and time.monotonic() - start < 20:
        closed = closed_by_peer(sock)
        if not closed:
            try:
                sock.send(b"\x00")
            except OSError:
                closed = True
    print(f"\ntrickling client (deadline 2000 ms): {'closed' if closed else 'still open'} after "
          f"{time.monotonic() - start:.1f}s")
    assert closed, "a frame trickled one byte at a time was never closed"
    assert "of its first byte; closing" in broker.log_tail(50)


@pytest.mark.parametrize("with_header", [False, True])
def test_two_gib_announcement_is_refused_at_once(broker, with_header):
    sock = socket.create_connection(broker.address, timeout=1)
    start = time.monotonic()
    sock.sendall(struct.pack(">i", 2**31 - 1) + (struct.pack(">hhi", ApiKey.PRODUCE, 0, 9) if with_header else b""))
    answer = b""
    deadline = time.monotonic() + 10  # connections.max.idle.ms is 600 s: only an immediate close passes
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        if not chunk:
            break
        answer += chunk
    else:
        pytest.fail("a 2 GiB announcement was left to a timer")
    print(f"\n2 GiB announcement ({'with' if with_header else 'without'} header): closed after "
          f"{time.monotonic() - start:.2f}s, {len(answer)} bytes answered")
    if with_header:
        assert struct.unpack(">iih", answer[:10])[1:] == (9, 7)  # RequestTooLarge
    served(broker)  # asserts another client's produce and fetch still work


def test_connections_holding_large_partial_frames_keep_the_broker_bounded(broker):
    """Eight connections each sending 40 MiB of a 99 MiB frame used to take 350 MB."""
    frame_size = 99 * MiB
    body = struct.pack(">ihhih", frame_size, ApiKey.PRODUCE, 0, 1, 0) + bytes(40 * MiB)
    before = rss_mb(broker)
    socks = [socket.create_connection(broker.address) for _ in range(8)]
    sent = [0] * len(socks)

    def push(i: int) -> None:
        sent[i] = send_until_stalled(socks[i], body, budget=15)

    threads = [threading.Thread(target=push, args=(i,)) for i in range(len(socks))]
    for t in threads:
        t.start()
    peak = before
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss_mb(broker))
        time.sleep(0.1)
    peak = max(peak, rss_mb(broker))
    wait = served(broker)
    peak = max(peak, rss_mb(broker))
    print(f"\n8 x 40 MiB of 99 MiB frames: {sum(sent) / MiB:.0f} MiB accepted by TCP, broker RSS {before:.0f} MB "
          f"-> peak {peak:.0f} MB; other client served in {wait:.2f}s; crashes {0 if broker.alive else 1}")
    for s in socks:
        s.close()
    assert broker.alive
    assert peak < 200, f"broker RSS reached {peak:.0f} MB"


def test_client_pipelining_without_reading_is_pushed_back(broker):
    """150,000 pipelined METADATA requests whose answers are never read."""
    with BrokerConnection(*broker.address).connect() as admin:
        for i in range(40):
            admin.create_topic(f"topic-with-a-longish-name-{i:03d}", 2)
    one = encode_request(ApiKey.METADATA, 1, "greedy", MetadataRequest([]).encode())
    requests = one * 150_000
    before = rss_mb(broker)
    greedy = socket.create_connection(broker.address)
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sent = [0]
    pusher = threading.Thread(target=lambda: sent.__setitem__(0, send_until_stalled(greedy, requests, budget=20)))
    pusher.start()
    waits, peak = [], before
    while pusher.is_alive() or len(waits) < 3:
        waits.append(served(broker))
        peak = max(peak, rss_mb(broker))
    pusher.join()
    peak = max(peak, rss_mb(broker))
    print(f"\ngreedy pipeliner: {sent[0] // len(one):,} of 150,000 requests accepted by TCP before the broker "
          f"stopped reading; broker RSS {before:.0f} -> peak {peak:.0f} MB; other client's produce+fetch: "
          f"{len(waits)} served, worst {max(waits):.2f}s; crashes {0 if broker.alive else 1}")
    greedy.close()
    assert broker.alive
    assert peak < 200, f"broker RSS reached {peak:.0f} MB"


def test_large_frames_beyond_the_budget_wait_their_turn_and_all_complete(cluster):
    """Four 900 KiB produce requests at once against a 1 MiB broker-wide budget: read
    one after another, each intact."""
    broker = cluster.start_broker(0, {"queued.max.request.bytes": MiB, "message.max.bytes": 2 * MiB,
                                      "socket.request.max.bytes": 4 * MiB})
    with BrokerConnection(*broker.address).connect() as admin:
        admin.create_topic("large", 4)
    values = [bytes([65 + i]) * (900 * 1024) for i in range(4)]
    results: list = [None] * 4

    def produce(i: int) -> None:
        with BrokerConnection(*broker.address, timeout=60).connect() as conn:
            results[i] = conn.produce("large", i, encode_message_set([(None, values[i], 1)]), acks=-1)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert all(results), "every large request is answered"
    with BrokerConnection(*broker.address).connect() as conn:
        for i in range(4):
            data = conn.fetch("large", i, 0, 2 * MiB).messages
            assert [m.value for m in iter_messages(data, 0)] == [values[i]]
    print(f"\n4 x 900 KiB requests through a 1 MiB budget: all answered; RSS {rss_mb(broker):.0f} MB")


def test_pushed_back_client_gets_every_answer_in_order_once_it_reads(broker):
    """Back-pressure pauses and resumes reading; it must never lose or reorder answers,
    immediate ones (METADATA) or waiting ones (acks=-1 PRODUCE) alike."""
    with BrokerConnection(*broker.address).connect() as admin:
        for i in range(20):
            admin.create_topic(f"inorder-{i:02d}", 2)
    count = 20_000
    metadata = MetadataRequest([]).encode()
    produce = ProduceRequest(-1, 1000, "inorder-00", 0, encode_message_set([(None, b"m", 1)])).encode()
    frames = b"".join(  # every 50th waits for a flush: answered through the pending queue
        encode_request(ApiKey.PRODUCE, i, "slow", produce) if i % 50 == 0 else
        encode_request(ApiKey.METADATA, i, "slow", metadata) for i in range(count)
    )
    sock = socket.create_connection(broker.address, timeout=60)
    sender = threading.Thread(target=sock.sendall, args=(frames,))
    sender.start()
    time.sleep(1.0)  # not reading: the broker stops reading from us
    stalled_rss = rss_mb(broker)
    answers = 0
    buffer = b""
    while answers < count:
        chunk = sock.recv(1 << 20)
        assert chunk, f"closed after {answers} answers"
        buffer += chunk
        pos = 0
        while len(buffer) - pos >= 8:
            size, correlation_id = struct.unpack_from(">ii", buffer, pos)
            if len(buffer) - pos - 4 < size:
                break
            assert correlation_id == answers, f"answer {answers} carries correlation id {correlation_id}"
            answers += 1
            pos += 4 + size
        buffer = buffer[pos:]
    sender.join(60)
    sock.close()
    print(f"\n{count:,} pipelined METADATA and acks=-1 PRODUCE requests read late: all answered in order; broker RSS while "
          f"stalled {stalled_rss:.0f} MB")
    assert answers == count
