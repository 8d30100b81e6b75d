"""A connection's answers, in request order (clients pipeline): Kafka's request channel
to the socket server's processor (`connection.py`).

Immediate answers of one socket read are written together after it, when nothing is
ahead of them: one syscall per answer was a third of the broker's time with pipelined
acks=1 producers. Anything else — an answer that waits (acks=-1, a long poll, topic
creation) or one with a file region — queues behind a writer task that awaits each in
turn and sends file regions with sendfile. A refused request is answered with its
error, or, for acks=0, only logged (docs/protocol.md, "acks").
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Awaitable, Callable

from broker.common.errors import AuthenticationError, ErrorCode, LogbusError
from broker.common.protocol import ApiKey, Body, RequestHeader, error_response, response_frame
from broker.server.replies import Reply
from broker.server.log.segment import FileRegion
from broker.server.refusals import RefusalLog

logger = logging.getLogger(__name__)

_REFUSED = {  # the log line of a refused request, by whether it asked for no answer (None: unreadable acks)
    None: "%s request %d refused, acks unreadable; closing: %s",
    True: "acks=0 %s request %d refused (not answered): %s",
    False: "%s request %d refused: %s",
}


def api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api {api_key}"


class Answers:
    """`pending` holds, in request order, the answers not yet written: lists of parts,
    or tasks that will produce them; `out` the immediate answers of the current read.
    `on_written` runs after each queued answer is written (the connection's
    book-keeping: activity, unsent bytes, whether to read on)."""

    def __init__(self, refusals: RefusalLog, on_written: Callable[[], None]) -> None:
        self.transport: asyncio.Transport | None = None  # set once connected
        self.refusals = refusals
        self.on_written = on_written
        self.pending: collections.deque = collections.deque()
        self.out: list[bytes] = []
        self.tls = False  # set once connected: a TLS transport cannot sendfile
        self.close_after = False  # close the connection once what is queued is written
        self.in_sendfile = False  # sendfile resumes reading on its own: the connection re-applies its choice
        self.on_sendfile_done: Callable[[], None] = lambda: None
        self._writer: asyncio.Task | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()

    def __len__(self) -> int:
        return len(self.pending) + len(self.out)

    # ------------------------------------------------------------------ queueing

    def ready(self, parts: Body) -> None:
        """An answer known now: written after this read, or queued behind earlier ones."""
        if not self.pending and (len(parts) == 1 and type(parts[0]) is bytes  # most answers: no generator
                                 or all(isinstance(p, bytes) for p in parts)):
            self.out += parts
            return
        self.pending.append(parts)
        self._start_writer()

    def waiting(self, header: RequestHeader, quiet: bool, reply: Reply) -> asyncio.Task:
        """An answer that waits: its place is kept in the queue."""
        task = asyncio.ensure_future(self._answer(header, quiet, reply))
        self.pending.append(task)
        self._start_writer()
        return task

    def queued(self, parts: Awaitable[Body | None]) -> asyncio.Task:
        """An answer that waits, framed by a front end of its own (the Kafka listener's)."""
        task = asyncio.ensure_future(parts)
        self.pending.append(task)
        self._start_writer()
        return task

    def refused(self, header: RequestHeader, exc: Exception, quiet: bool | None) -> Body | None:
        """The answer to a request that failed — none for acks=0 — and its log line."""
        what = api_name(header.api_key)
        if not isinstance(exc, LogbusError):
            logger.error("%s: %s request %d failed", self.refusals.peer, what, header.correlation_id, exc_info=exc)
            code, text = ErrorCode.UNKNOWN, "internal broker error; see its log"
        else:
            code, text = exc.code, str(exc)
            self.refusals.warning(f"{what} {type(exc).__name__}", _REFUSED[quiet], what, header.correlation_id, exc)
            if isinstance(exc, AuthenticationError):
                self.close_after = True  # a failed handshake ends the connection, once its answer is out
        if quiet is not False:
            return None
        return [error_response(header.correlation_id, code, text)]

    async def _answer(self, header: RequestHeader, quiet: bool, reply: Reply) -> Body | None:
        """The frame of a reply that waits, or of its refusal."""
        try:
            body = await reply
            return None if body is None else response_frame(header.correlation_id, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self.refused(header, exc, quiet)

    # ------------------------------------------------------------------- writing

    def flush_out(self) -> bool:
        """One write for all immediate answers of one socket read; whether it wrote."""
        if not self.out:
            return False
        out, self.out = self.out, []
        self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        if self.close_after and not self.pending:
            self.transport.close()  # after writing what is buffered
        return True

    def send(self, parts: list[bytes]) -> None:
        """Write now, after what is already out (a refusal before closing)."""
        self.flush_out()
        for part in parts:
            self.transport.write(part)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def _start_writer(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write_pending())  # runs after `flush_out`
            self._writer.add_done_callback(self._writer_done)

    def _writer_done(self, writer: asyncio.Task) -> None:
        """Retrieve the writer's end: a client gone mid-answer is ordinary (debug), anything
        else is the broker's fault and logged once, never left for the garbage collector."""
        if writer.cancelled() or writer.exception() is None:
            return
        exc = writer.exception()
        if isinstance(exc, ConnectionError) or self.transport.is_closing():
            logger.debug("%s: gone while an answer was written: %r", self.refusals.peer, exc)
        else:
            logger.error("%s: writing answers failed", self.refusals.peer, exc_info=exc)

    async def _write_pending(self) -> None:
        """Write the queued answers in order. The transport can start closing during any
        await (the client sent EOF while answers it never read fill the buffer, so
        `connection_lost` waits), hence the check after each one before writing more."""
        loop = asyncio.get_running_loop()
        transport = self.transport
        while self.pending and not transport.is_closing():
            item = self.pending[0]
            parts = await item if isinstance(item, asyncio.Task) else item
            if transport.is_closing():
                return
            for part in parts or ():
                if isinstance(part, FileRegion) and self.tls:
                    # TLS encrypts in user space: the bytes must pass through us (no sendfile)
                    transport.write(part.read())
                elif isinstance(part, FileRegion):
                    if part.length:
                        self.in_sendfile = True
                        try:
                            await loop.sendfile(transport, part.file, part.position, part.length)
                        finally:
                            self.in_sendfile = False
                            self.on_sendfile_done()
                else:
                    transport.write(part)
            await self._can_write.wait()
            self.pending.popleft()
            self.on_written()
            if self.close_after and not self.pending and not self.out:
                transport.close()

    def cancel(self) -> None:
        """The connection is gone: drop every answer, stop the writer."""
        for item in self.pending:
            if isinstance(item, asyncio.Task):
                item.cancel()
        self.pending.clear()
        self.out = []
        if self._writer is not None:
            self._writer.cancel()
        self._can_write.set()
