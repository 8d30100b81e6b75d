"""One client connection: Kafka's socket-server processor — framing and receive
buffers, dispatch, and back-pressure. Its answers go out through `answers.py`.

A `Connection` receives straight into its own buffer (`asyncio.BufferedProtocol`): a
scratch buffer for ordinary frames (16 KiB, growing to 256 KiB on a busy connection),
or, for a frame larger than that, a buffer of exactly the frame's size whose bytes are
first reserved from the broker-wide budget (`broker.server.flowcontrol`). The size of a
frame is checked before its body is read, so an absurd size costs nothing and is
refused at once. Before a connection authenticates, its frames may be no larger than
`sasl.server.max.receive.size` (at most 128 KiB): they stay in its scratch buffer and
reserve nothing of the budget. Every complete frame is dispatched as soon as it is
complete, whatever follows it in the same read.

The connection stops reading — and TCP pushes back on the client — while it has too
many requests in flight, too many answer bytes its client has not read, or a large
frame waiting for the broker-wide budget.

`request.read.timeout.ms` runs from the first byte of a frame, so trickling bytes does
not extend it; time the broker itself spends not reading (back-pressure) is not counted.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import socket
import struct
import time
from typing import TYPE_CHECKING

from broker.common.errors import ErrorCode, InvalidRequest, RequestTooLarge
from broker.common.protocol import ApiKey, decode_request_header, error_response, response_frame
from broker.server.answers import Answers
from broker.server.auth.listeners import Listener
from broker.server.auth.session import Session
from broker.server.auth.tls import subject_principal
from broker.server.flowcontrol import ConnectionLimits, RequestPool
from broker.server.refusals import RefusalLog

if TYPE_CHECKING:
    from broker.server.broker import Broker

logger = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
_CORRELATION = struct.Struct(">hhi")
MIN_REQUEST_SIZE = 10  # api_key, api_version, correlation_id, empty client_id
SCRATCH_BYTES = 256 * 1024  # frames up to this size are read into the connection's scratch buffer
INITIAL_SCRATCH_BYTES = 16 * 1024  # an idle connection costs this; busy ones grow to SCRATCH_BYTES
_ACKS_APIS = (ApiKey.PRODUCE, ApiKey.MULTIPRODUCE)  # requests whose first body byte is acks


def acks_zero(api_key: int, api_version: int, frame, body_pos: int) -> bool | None:
    """Whether a request asked for no answer (acks=0): True, False, or None when it is a
    produce request too short to say (its frame cannot be trusted)."""
    if api_key not in _ACKS_APIS or api_version != 0:
        return False
    if len(frame) <= body_pos:
        return None
    return frame[body_pos] == 0


class Connection(asyncio.BufferedProtocol):
    """One client connection. Unparsed bytes are `_buf[_start:_end]`, or
    `_big[:_big_filled]` while a large frame is being read; answers wait in `answers`.
    Framing, large frames and back-pressure stay in one class (docs/architecture.md, "Sizes")."""

    def __init__(self, server: "Broker", listener: Listener) -> None:
        self.server = server
        self.listener = listener
        self.session: Session | None = None  # set once connected
        self.pool: RequestPool = server.pool
        self.limits: ConnectionLimits = server.limits
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.refusals = RefusalLog(logger, self.peer)
        self._buf = bytearray(INITIAL_SCRATCH_BYTES)
        self._start = self._end = 0
        self._filled = False  # the last read filled all the room it was given
        self._big: memoryview | None = None
        self._big_filled = 0
        self._big_reserved = 0
        self._waiting_for_pool = False
        self.answers = Answers(self.refusals, self._answered)
        self.answers.on_sendfile_done = self._apply_reading
        self._unsent = 0  # answer bytes in the transport's buffer at the last look
        self._reading = True
        self._paused_at = 0.0
        self._processing = False
        self.last_active = time.monotonic()
        self.frame_started: float | None = None  # first byte of the incomplete frame

    # ------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self.transport.set_write_buffer_limits(high=self.limits.max_unsent, low=self.limits.max_unsent // 2)
        self.answers.transport = self.transport
        self.answers.tls = self.listener.protocol.tls
        host, port = (transport.get_extra_info("peername") or ("?", "?"))[:2]
        self.peer = f"{host}:{port}"
        self.refusals.peer = self.peer
        self.session = Session(self.listener, str(host), authenticated=not self.listener.protocol.sasl)
        certificate = transport.get_extra_info("peercert") if self.listener.protocol.tls else None
        if certificate and not self.listener.protocol.sasl:
            self.session.principal = subject_principal(certificate.get("subject", ()))
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.stalled.discard(self)
        self.answers.cancel()
        self._release_big()
        self._big = None
        self.pool.forget(self)
        self.refusals.close()

    def pause_writing(self) -> None:
        self.answers.pause_writing()
        self._note_unsent()
        self._update_reading()

    def resume_writing(self) -> None:
        self.answers.resume_writing()
        self._note_unsent()
        self._update_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big is not None:
            return self._big[self._big_filled :]
        if self._start or self._end == len(self._buf) or self._filled:
            self._compact()
        return memoryview(self._buf)[self._end :]

    def _compact(self) -> None:
        """Move the unparsed tail to the front, so every read may fill most of the
        buffer: fewer, larger reads mean fewer log writes for acks=0 appends. Grow,
        up to SCRATCH_BYTES, when the last read filled all the room it was given (a
        busy connection) or a frame needs more room. The tail is less than one frame
        unless reading goes on while paused (a sendfile resumes the transport); grow
        then too, rarely."""
        buf, start, end = self._buf, self._start, self._end
        if start:
            buf[: end - start] = buf[start:end]
            self._start, self._end = 0, end - start
        if (self._filled or self._end == len(buf)) and len(buf) < SCRATCH_BYTES:
            buf.extend(bytes(min(len(buf), SCRATCH_BYTES - len(buf))))
        elif self._end == len(buf):
            buf.extend(bytes(SCRATCH_BYTES))
        self._filled = False

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        if self._big is not None:
            self._big_filled += nbytes
            if self._big_filled < len(self._big):
                return
            frame, self._big = self._big, None
            reserved, self._big_reserved = self._big_reserved, 0
            self.frame_started = None
            pending = self.answers.pending
            queued = len(pending)
            try:
                self._dispatch(frame)
            finally:
                del frame
                self._release_after(reserved, pending[-1] if len(pending) > queued else None)
        else:
            self._filled = self._end + nbytes == len(self._buf)
            self._end += nbytes
        self._process()

    # ------------------------------------------------------------------- framing

    def _process(self) -> None:
        """Dispatch every complete frame in the scratch buffer, as far as the limits
        allow; then write the immediate answers and decide whether to keep reading.
        (The hot loop of the produce path: positions live in locals, checks are loads.)"""
        transport = self.transport
        if self._processing or transport is None or transport.is_closing():
            return
        self._processing = True
        buf = self._buf
        config = self.server.config  # unauthenticated: small frames only, never a large frame's budget
        limit = config.socket_request_max_bytes if self.session.authenticated else config.sasl_server_max_receive_size
        max_out = self.limits.max_in_flight
        pool = self.pool
        dispatch = self._dispatch
        answers = self.answers
        start, end = self._start, self._end
        consumed = False
        view = memoryview(buf)
        try:
            while end - start >= 4:
                if (answers.pending or self._unsent or pool.over or self._waiting_for_pool) and self._must_stop():
                    break
                (size,) = _SIZE.unpack_from(buf, start)
                if size < MIN_REQUEST_SIZE or size > limit:
                    self._start = start
                    self._refuse_frame(size, limit)
                    start, end = self._start, self._end
                    return
                if size + 4 > SCRATCH_BYTES and end - start - 4 < size:
                    self._start = start
                    view.release()
                    started = self._begin_big(size)
                    start, end = self._start, self._end
                    view = memoryview(buf)
                    if not started or self._big is not None:
                        break  # waiting for the budget, or the rest goes straight into its own buffer
                    continue
                if end - start - 4 < size:
                    break
                frame = bytes(view[start + 4 : start + 4 + size])
                start += 4 + size
                consumed = True
                dispatch(frame)
                if transport.is_closing():
                    return
                if len(answers.out) >= max_out:
                    self._flush_out()  # immediate answers count against max.in.flight: written at it, never a stop
        finally:
            view.release()
            self._start, self._end = start, end
            self._processing = False
            if consumed:
                self.frame_started = None
            self.server.handler.write_unwritten()
            if not transport.is_closing():
                self._flush_out()
                if self._start == self._end:
                    self._start = self._end = 0
                if (self._start != self._end or self._big is not None) and self.frame_started is None:
                    self.frame_started = time.monotonic()
                self._update_reading()

    def _begin_big(self, size: int) -> bool:
        """A frame too large for the scratch buffer gets its own, once the broker-wide
        budget grants its size. Anonymous mmap: pages cost memory only once filled."""
        if not self.pool.try_reserve(self, size, self._pool_granted):
            self._waiting_for_pool = True
            return False
        self._waiting_for_pool = False
        self._big_reserved = size
        body = self._start + 4
        have = self._end - body
        big = memoryview(mmap.mmap(-1, size))
        big[:have] = memoryview(self._buf)[body : self._end]
        self._big, self._big_filled = big, have
        self._start = self._end = 0
        return True

    def _pool_granted(self) -> None:
        """Called by the pool when this connection may try to reserve again."""
        asyncio.get_running_loop().call_soon(self._retry_pool)

    def _retry_pool(self) -> None:
        if self._waiting_for_pool and self.transport is not None and not self.transport.is_closing():
            self._waiting_for_pool = False
            self._process()

    def _release_after(self, size: int, pending: object) -> None:
        """Give a large frame's budget back once nothing holds its bytes: at once, or
        when the request that waits (topic creation, flush) is answered or cancelled."""
        if isinstance(pending, asyncio.Task) and not pending.done():
            pending.add_done_callback(lambda _task: self.pool.release(size))
        else:
            self.pool.release(size)

    def _release_big(self) -> None:
        if self._big_reserved:
            size, self._big_reserved = self._big_reserved, 0
            self.pool.release(size)

    def _refuse_frame(self, size: int, limit: int) -> None:
        """A frame we will not read (it starts the unparsed bytes). An announcement over
        the limit is answered RequestTooLarge when its header came with it; either way
        the connection is closed at once — never left to a timer."""
        available = self._end - self._start
        over = (f"socket.request.max.bytes={limit}" if self.session.authenticated
                else f"sasl.server.max.receive.size={limit} before authentication")
        if size > limit and available >= 4 + _CORRELATION.size:
            correlation_id = _CORRELATION.unpack_from(self._buf, self._start + 4)[2]
            logger.warning("%s: request of %d bytes exceeds %s; closing", self.peer, size, over)
            self.answers.send(self._too_large_answer(correlation_id, f"request of {size} bytes exceeds {over}"))
        elif size > limit:
            logger.warning("%s: frame announces %d bytes, over %s, without its header; closing", self.peer, size, over)
        else:
            logger.warning("%s: impossible frame size %d; closing", self.peer, size)
        self._start = self._end = 0
        self.close()

    @staticmethod
    def _too_large_answer(correlation_id: int, text: str) -> list[bytes]:
        """What a client is told before its too-large request closes the connection."""
        return [error_response(correlation_id, ErrorCode.REQUEST_TOO_LARGE, str(RequestTooLarge(text)))]

    # ------------------------------------------------------------------- requests

    def _dispatch(self, frame: bytes | memoryview) -> None:
        try:
            header, reader = decode_request_header(frame)
        except InvalidRequest as exc:
            logger.warning("%s: unreadable request header (%s); closing", self.peer, exc)
            self.close()
            return
        body_pos = reader.pos
        try:
            reply = self.server.handler.handle(header, reader, self.session)
        except Exception as exc:
            quiet = acks_zero(header.api_key, header.api_version, frame, body_pos)
            parts = self.answers.refused(header, exc, quiet)
            if quiet is None:
                self.close()
                return
        else:
            if not reply.done():
                self.answers.waiting(header, acks_zero(header.api_key, header.api_version, frame, body_pos) is True,
                                     reply)
                return
            body = reply.result()
            if body is None:
                return
            parts = response_frame(header.correlation_id, body)
        if parts is not None:
            self.answers.ready(parts)

    def _flush_out(self) -> None:
        if self.answers.flush_out():
            self._note_unsent()

    def _answered(self) -> None:
        """A queued answer is written."""
        self.last_active = time.monotonic()
        self._note_unsent()
        self._update_reading()

    # ---------------------------------------------------------------- back-pressure

    def _note_unsent(self) -> None:
        if self.transport is not None:
            unsent = self.transport.get_write_buffer_size()
            if unsent != self._unsent:
                self._unsent = unsent
                self.pool.set_unsent(self, unsent)

    def _must_stop(self) -> bool:
        return not self.limits.may_read(len(self.answers), self._unsent, self.pool.over,
                                        self._waiting_for_pool)

    def _update_reading(self) -> None:
        """Pause or resume reading to match the limits; on resuming, first dispatch the
        complete frames that were left in the buffer while paused."""
        if self.transport is None or self.transport.is_closing():
            return
        want = not self._must_stop()
        if want == self._reading:
            return
        self._reading = want
        if want:
            self.server.stalled.discard(self)
            if self.frame_started is not None:
                self.frame_started += time.monotonic() - self._paused_at  # our pause is not the client's delay
            self._apply_reading()
            if self._end > self._start and not self._processing:
                asyncio.get_running_loop().call_soon(self._process)
        else:
            self._paused_at = time.monotonic()
            self.server.stalled.add(self)
            self._apply_reading()

    def _apply_reading(self) -> None:
        if self.answers.in_sendfile or self.transport is None or self.transport.is_closing():
            return
        if self._reading:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()

    def recheck(self) -> None:
        """Look again at a stalled connection: its client may have read its answers."""
        self._note_unsent()
        self._update_reading()
        if self._waiting_for_pool:
            self._retry_pool()

    def overdue(self, now: float, timeout_ms: int) -> bool:
        """A frame started more than `timeout_ms` ago (not counting our own pauses)."""
        return self._reading and self.frame_started is not None and (now - self.frame_started) * 1000 > timeout_ms

    @property
    def busy(self) -> bool:
        return bool(self.answers.pending)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._flush_out()
            self.transport.close()
