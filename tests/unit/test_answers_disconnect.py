"""A client that goes away while an answer with log data is pending (issue 33, part 4).

The client half-closes with answers still unread in the broker's send buffer: the
transport is closing but not yet lost, so `connection_lost` (which cancels the writer)
has not run when the pending fetch answer completes. The writer must then stop quietly
instead of calling `sendfile` on the closing transport and leaving its task's
exception unretrieved. Real sockets and a real event loop; only the request handling
is left out (an `asyncio.Future` stands in for a long-polling fetch's reply).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import tempfile

from broker.common.protocol import RequestHeader
from broker.server.answers import Answers
from broker.server.log.segment import FileRegion
from broker.server.refusals import RefusalLog


class _Server(asyncio.Protocol):
    """The broker's side of one connection, reduced to its answers."""

    def __init__(self, made: asyncio.Future) -> None:
        self.made = made
        self.lost = False
        self.answers = Answers(RefusalLog(logging.getLogger("test"), "peer"), on_written=lambda: None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.answers.transport = transport
        self.made.set_result(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.answers.cancel()


async def _disconnect_with_fetch_pending(log_file) -> tuple[_Server, list[asyncio.Task]]:
    loop = asyncio.get_running_loop()
    made = loop.create_future()
    server = await loop.create_server(lambda: _Server(made), "127.0.0.1", 0)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # reads nothing: the broker's buffer fills
    client.setblocking(False)
    await loop.sock_connect(client, server.sockets[0].getsockname())
    side: _Server = await made
    answers = side.answers
    answers.transport.set_write_buffer_limits(high=1 << 30)  # keep the bytes buffered, not paused
    answers.ready([b"x" * (8 << 20)])  # an immediate answer the client never reads
    answers.flush_out()
    reply: asyncio.Future = loop.create_future()
    answers.waiting(RequestHeader(1, 0, 7, "c"), False, reply)  # a long-polling fetch
    client.shutdown(socket.SHUT_WR)  # the client goes: the broker reads EOF and closes
    for _ in range(200):
        if answers.transport.is_closing():
            break
        await asyncio.sleep(0.01)
    assert answers.transport.is_closing() and not side.lost, "the transport must be closing, not yet lost"
    reply.set_result([b"\x00" * 8, FileRegion(log_file, 0, 4096)])  # new data: the fetch answers
    for _ in range(5):
        await asyncio.sleep(0)
    writer = answers._writer
    client.close()
    server.close()
    return side, [writer]


def test_a_client_gone_while_a_fetch_answer_is_pending_leaves_no_error(caplog) -> None:
    with tempfile.TemporaryFile() as log_file:
        log_file.write(b"m" * 4096)
        log_file.flush()
        loop = asyncio.new_event_loop()
        unhandled: list[dict] = []
        loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
        try:
            with caplog.at_level(logging.DEBUG):
                side, tasks = loop.run_until_complete(_disconnect_with_fetch_pending(log_file))
                assert all(task.done() for task in tasks), "the writer must have stopped"
                errors = [task.exception() for task in tasks if not task.cancelled()]
                del side, tasks
                gc.collect()
        finally:
            loop.close()
    assert errors == [None], f"the writer failed on a closing transport: {errors}"
    assert unhandled == [], unhandled
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
