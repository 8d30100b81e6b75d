"""A real `Broker` in this process with one real `Connection` on a loopback TCP pair,
fed bytes the way the event loop feeds a socket read (`get_buffer`, copy,
`buffer_updated`): for tests that must know which frames share a read, and for
benchmarks of the broker's request path without the socket's noise."""

from __future__ import annotations

import asyncio
import socket
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Callable, NamedTuple

from broker.server.broker import Broker
from broker.server.config import BrokerConfig
from broker.server.connection import Connection
from harness.process import free_port


class FedBroker(NamedTuple):
    broker: Broker
    conn: Connection
    peer: socket.socket  # the client's end: answers arrive here


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A connected TCP pair on loopback (the connection sets TCP options): (broker's end, client's end)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        ours, _ = server.accept()
    return ours, client


@asynccontextmanager
async def fed_broker(zookeeper: str, workdir: Path, settings: dict[str, str] | None = None) -> AsyncIterator[FedBroker]:
    """A started broker (id 0, logs under `workdir`) and a connection whose socket is
    never read: the caller feeds it (`feed`). Both stopped after the block."""
    config = BrokerConfig.from_settings({
        "broker.id": "0", "zookeeper.connect": zookeeper, "port": str(free_port()),
        "log.dirs": str(workdir / "logs"), **(settings or {}),
    })
    broker = Broker(config)
    await broker.start()
    ours, peer = tcp_pair()
    try:
        _, conn = await asyncio.get_running_loop().connect_accepted_socket(
            lambda: Connection(broker, broker.listeners[0]), ours)
        conn.transport.pause_reading()  # nothing arrives on the socket: the caller feeds it
        yield FedBroker(broker, conn, peer)
        conn.close()
    finally:
        peer.close()
        await broker.stop()


async def create_topic(broker: Broker, topic: str, partitions: int = 1, timeout: float = 30) -> None:
    """Create `topic` and wait until the assignment's watch opened every partition's log."""
    await broker.handler.topics.auto_create(topic)
    deadline = time.monotonic() + timeout
    while any(broker.handler.logs.get(topic, p) is None for p in range(partitions)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no log of every partition of {topic} {timeout} s after its creation")
        await asyncio.sleep(0.01)


def feed(conn: Connection, stream: bytes, read_bytes: int, after_read: Callable[[], object] = lambda: None) -> None:
    """Hand `stream` to the connection a read at a time, each at most `read_bytes` and
    the room the connection offers; `after_read` runs after each."""
    view, pos = memoryview(stream), 0
    while pos < len(view):
        room = conn.get_buffer(-1)
        n = min(len(room), read_bytes, len(view) - pos)
        room[:n] = view[pos : pos + n]
        room.release()  # as the transport's recv_into does: the buffer may grow at the next read
        conn.buffer_updated(n)
        pos += n
        after_read()
