"""The asyncio server: framing, in-order responses, back-pressure, timeouts, start and
clean stop.

A `Connection` receives straight into its own buffer (`asyncio.BufferedProtocol`): a
scratch buffer for ordinary frames (16 KiB, growing to 256 KiB on a busy connection),
or, for a frame larger than that, a buffer of
exactly the frame's size whose bytes are first reserved from the broker-wide budget
(`broker.server.flowcontrol`). The size of a frame is checked before its body is read, so an
absurd size costs nothing and is refused at once. Every complete frame is dispatched as
soon as it is complete, whatever follows it in the same read.

Responses go out in request order (clients pipeline): immediate ones are written
together after each read when nothing is ahead of them, the rest queue behind a writer
task that sends file regions with sendfile. The connection stops reading — and TCP
pushes back on the client — while it has too many requests in flight, too many answer
bytes its client has not read, or a large frame waiting for the broker-wide budget.

`request.read.timeout.ms` runs from the first byte of a frame, so trickling bytes does
not extend it; time the broker itself spends not reading (back-pressure) is not counted.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import mmap
import signal
import socket
import struct
import time

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from broker.server.config import BrokerConfig
from broker.server.controller import Controller
from broker.common.errors import ErrorCode, InvalidRequest, LogbusError, RequestTooLarge
from broker.server.flowcontrol import ConnectionLimits, RequestPool
from broker.server.handlers import Reply, RequestHandler
from broker.server.log.manager import LogManager, log_config
from broker.server.log.scheduler import FlushScheduler
from broker.server.log.segment import FileRegion
from broker.common.protocol import ApiKey, Body, BrokerInfo, decode_request_header, error_response, response_frame
from broker.server.refusals import RefusalLog
from broker.server.registration import BrokerRegistry
from broker.server.replication.manager import ReplicaManager

logger = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
_CORRELATION = struct.Struct(">hhi")
MIN_REQUEST_SIZE = 10  # api_key, api_version, correlation_id, empty client_id
SCRATCH_BYTES = 256 * 1024  # frames up to this size are read into the connection's scratch buffer
INITIAL_SCRATCH_BYTES = 16 * 1024  # an idle connection costs this; busy ones grow to SCRATCH_BYTES
_ACKS_APIS = (ApiKey.PRODUCE, ApiKey.MULTIPRODUCE)  # requests whose first body byte is acks
_REFUSED = {  # the log line of a refused request, by `acks_zero`'s answer
    None: "%s request %d refused, acks unreadable; closing: %s",
    True: "acks=0 %s request %d refused (not answered): %s",
    False: "%s request %d refused: %s",
}


def api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api {api_key}"


def acks_zero(api_key: int, api_version: int, frame, body_pos: int) -> bool | None:
    """Whether a request asked for no answer (acks=0): True, False, or None when it is a
    produce request too short to say (its frame cannot be trusted)."""
    if api_key not in _ACKS_APIS or api_version != 0:
        return False
    if len(frame) <= body_pos:
        return None
    return frame[body_pos] == 0


class Connection(asyncio.BufferedProtocol):
    """One client connection. `_pending` holds, in request order, the responses not yet
    written: lists of parts, or tasks that will produce them. Unparsed bytes are
    `_buf[_start:_end]`, or `_big[:_big_filled]` while a large frame is being read."""

    def __init__(self, server: "Broker") -> None:
        self.server = server
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
        self._pending: collections.deque = collections.deque()
        self._out: list[bytes] = []  # immediate responses of the current socket read
        self._unsent = 0  # answer bytes in the transport's buffer at the last look
        self._writer: asyncio.Task | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._reading = True
        self._in_sendfile = False
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
        self.peer = "%s:%s" % (transport.get_extra_info("peername") or ("?", "?"))[:2]
        self.refusals.peer = self.peer
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.stalled.discard(self)
        for item in self._pending:
            if isinstance(item, asyncio.Task):
                item.cancel()
        self._pending.clear()
        if self._writer is not None:
            self._writer.cancel()
        self._can_write.set()
        self._release_big()
        self._big = None
        self.pool.forget(self)
        self.refusals.close()

    def pause_writing(self) -> None:
        self._can_write.clear()
        self._note_unsent()
        self._update_reading()

    def resume_writing(self) -> None:
        self._can_write.set()
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
            queued = len(self._pending)
            try:
                self._dispatch(frame)
            finally:
                del frame
                self._release_after(reserved, self._pending[-1] if len(self._pending) > queued else None)
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
        limit = self.server.config.socket_request_max_bytes
        max_out = self.limits.max_in_flight
        pool = self.pool
        dispatch = self._dispatch
        start, end = self._start, self._end
        consumed = False
        view = memoryview(buf)
        try:
            while end - start >= 4:
                if (self._pending or self._out or self._unsent or pool.over or self._waiting_for_pool) and self._must_stop():
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
                if len(self._out) >= max_out:
                    self._flush_out()  # immediate answers count against max.in.flight too
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
        if size > limit and available >= 4 + _CORRELATION.size:
            correlation_id = _CORRELATION.unpack_from(self._buf, self._start + 4)[2]
            logger.warning("%s: request of %d bytes exceeds socket.request.max.bytes=%d; closing", self.peer, size, limit)
            self._send([error_response(correlation_id, ErrorCode.REQUEST_TOO_LARGE,
                                       str(RequestTooLarge(f"request of {size} bytes exceeds socket.request.max.bytes={limit}")))])
        elif size > limit:
            logger.warning("%s: frame announces %d bytes, over socket.request.max.bytes=%d, without its header; closing",
                           self.peer, size, limit)
        else:
            logger.warning("%s: impossible frame size %d; closing", self.peer, size)
        self._start = self._end = 0
        self.close()

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
            reply = self.server.handler.handle(header, reader)
        except Exception as exc:
            quiet = acks_zero(header.api_key, header.api_version, frame, body_pos)
            parts = self._refused(header, exc, quiet)
            if quiet is None:
                self.close()
                return
        else:
            if not reply.done():
                quiet = acks_zero(header.api_key, header.api_version, frame, body_pos) is True
                self._pending.append(asyncio.ensure_future(self._answer(header, quiet, reply)))
                self._start_writer()
                return
            body = reply.result()
            if body is None:
                return
            parts = response_frame(header.correlation_id, body)
        if parts is None:
            return
        if not self._pending and all(isinstance(p, bytes) for p in parts):
            self._out += parts  # written together after this read (`_flush_out`)
            return
        self._pending.append(parts)
        self._start_writer()

    def _start_writer(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write_pending())  # runs after `_flush_out`

    def _refused(self, header, exc: Exception, quiet: bool | None) -> Body | None:
        """The answer to a request that failed — none for acks=0 — and its log line."""
        what = api_name(header.api_key)
        if not isinstance(exc, LogbusError):
            logger.error("%s: %s request %d failed", self.peer, what, header.correlation_id, exc_info=exc)
            code, text = ErrorCode.UNKNOWN, "internal broker error; see its log"
        else:
            code, text = exc.code, str(exc)
            self.refusals.warning(f"{what} {type(exc).__name__}", _REFUSED[quiet], what, header.correlation_id, exc)
        if quiet is not False:
            return None
        return [error_response(header.correlation_id, code, text)]

    async def _answer(self, header, quiet: bool, reply: Reply) -> Body | None:
        """The frame of a reply that waits, or of its refusal."""
        try:
            body = await reply
            return None if body is None else response_frame(header.correlation_id, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self._refused(header, exc, quiet)

    async def _write_pending(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending and self.transport is not None and not self.transport.is_closing():
            item = self._pending[0]
            parts = await item if isinstance(item, asyncio.Task) else item
            for part in parts or ():
                if isinstance(part, FileRegion):
                    if part.length:
                        self._in_sendfile = True
                        try:
                            await loop.sendfile(self.transport, part.file, part.position, part.length)
                        finally:
                            self._in_sendfile = False
                            self._apply_reading()  # sendfile resumes reading on its own
                else:
                    self.transport.write(part)
            await self._can_write.wait()
            self._pending.popleft()
            self.last_active = time.monotonic()
            self._note_unsent()
            self._update_reading()

    def _flush_out(self) -> None:
        """One write for all immediate answers to one socket read: one syscall per answer
        was a third of the broker's time with pipelined acks=1 producers."""
        if self._out:
            out, self._out = self._out, []
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            self._note_unsent()

    def _send(self, parts: list[bytes]) -> None:
        self._flush_out()
        for part in parts:
            self.transport.write(part)

    # ---------------------------------------------------------------- back-pressure

    def _note_unsent(self) -> None:
        if self.transport is not None:
            unsent = self.transport.get_write_buffer_size()
            if unsent != self._unsent:
                self._unsent = unsent
                self.pool.set_unsent(self, unsent)

    def _must_stop(self) -> bool:
        return not self.limits.may_read(len(self._pending) + len(self._out), self._unsent, self.pool.over,
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
        if self._in_sendfile or self.transport is None or self.transport.is_closing():
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
        return bool(self._pending)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._flush_out()
            self.transport.close()


class Broker:
    """A broker process: logs, ZooKeeper registration, the server, background tasks."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.logs = LogManager(config.log_dirs, functools.partial(log_config, config))
        self.scheduler = FlushScheduler()
        self.zk = KazooClient(
            hosts=config.zookeeper_connect,
            timeout=config.zookeeper_session_timeout_ms / 1000,
            # kazoo's default back-off grows to an hour: after a long ZooKeeper outage the
            # broker would stay unregistered (clients think it dead) for up to the last
            # interval. Retry at least every `zookeeper.reconnect.backoff.max.ms`.
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.1, backoff=2, max_jitter=0.1,
                max_delay=config.zookeeper_reconnect_backoff_max_ms / 1000,
            ),
        )
        self.registry = BrokerRegistry(
            self.zk, BrokerInfo(config.broker_id, config.host, config.port), self._on_assignment,
            config.zookeeper_session_timeout_ms,
        )
        self.replicas = ReplicaManager(config, self.logs, self.scheduler, self.registry, self.zk)
        self.handler = RequestHandler(config, self.logs, self.scheduler, self.registry, self.replicas)
        # every broker is a controller candidate; one is active (broker.server.controller)
        self.controller = Controller(
            self.zk, config.broker_id, config.unclean_leader_election_enable,
            config.leader_imbalance_check_interval_seconds if config.auto_leader_rebalance_enable else None,
            imbalance_percentage=config.leader_imbalance_per_broker_percentage)
        self.pool = RequestPool(config.queued_max_request_bytes)
        self.limits = ConnectionLimits(config.max_in_flight_requests, config.socket_send_buffer_max_bytes)
        self.connections: set[Connection] = set()
        self.stalled: set[Connection] = set()  # connections not being read (back-pressure)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task] = []

    def _on_assignment(self, topic: str, assignment: dict[int, list[int]]) -> None:
        for partition, replicas in assignment.items():
            if len(replicas) == 1 and replicas[0] == self.config.broker_id:
                self.logs.get_or_create(topic, partition)
        self.replicas.on_assignment(topic, assignment)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.logs.load)
        self.replicas.start(loop)
        await loop.run_in_executor(None, self.zk.start, self.config.zookeeper_connection_timeout_ms / 1000)
        await loop.run_in_executor(None, self.registry.start)
        self._server = await loop.create_server(
            lambda: Connection(self), self.config.host, self.config.port, reuse_address=True, backlog=512
        )
        await loop.run_in_executor(None, self.registry.register)
        await loop.run_in_executor(None, self.controller.start)
        self._tasks = [
            asyncio.ensure_future(self._every(self.config.log_retention_check_interval_ms, self._retention)),
            asyncio.ensure_future(self._every(1000, self._close_stale_connections)),
            asyncio.ensure_future(self._every(100, self._recheck_stalled)),
        ]
        logger.info("broker %d serving on %s:%d", self.config.broker_id, self.config.host, self.config.port)

    async def _every(self, interval_ms: int, job) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await job()
            except Exception:
                logger.exception("background job %s failed", job.__name__)

    async def _retention(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.logs.delete_old_segments)

    async def _recheck_stalled(self) -> None:
        """Stalled connections learn of drained socket buffers here: the transport only
        reports draining below its low-water mark, not every byte its client reads."""
        for conn in list(self.stalled):
            conn.recheck()
        self.pool.wake_first()

    async def _close_stale_connections(self) -> None:
        now = time.monotonic()
        timeout = self.config.request_read_timeout_ms
        for conn in list(self.connections):
            if conn.overdue(now, timeout):
                logger.warning("%s: request not completed within %d ms of its first byte; closing", conn.peer, timeout)
                conn.close()
            elif not conn.busy and (now - conn.last_active) * 1000 > self.config.connections_max_idle_ms:
                logger.info("%s: idle for %d ms; closing", conn.peer, self.config.connections_max_idle_ms)
                conn.close()

    async def abort(self) -> None:
        """Undo a failed start: leave ZooKeeper, stop serving and replicating. The logs
        are left unmarked, so the next start recovers them: the start may have failed
        while loading them. Never raises over the start's own error."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.controller.stop)
            self.replicas.stop()
            await loop.run_in_executor(None, self.registry.stop)
        except Exception:
            logger.exception("broker %d: cleaning up after a failed start failed", self.config.broker_id)
        if self._server is not None:
            self._server.close()
        self.scheduler.shutdown()

    async def stop(self) -> None:
        """Deregister, stop serving, flush every log, mark the shutdown clean."""
        loop = asyncio.get_running_loop()
        self.handler.shutting_down = True
        for task in self._tasks:
            task.cancel()
        await loop.run_in_executor(None, self.controller.stop)
        self.replicas.stop()
        await loop.run_in_executor(None, self.registry.stop)
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        await loop.run_in_executor(None, self.logs.close)
        self.scheduler.shutdown()
        logger.info("broker %d stopped cleanly", self.config.broker_id)


async def serve(config: BrokerConfig) -> None:
    """Run a broker until SIGTERM or SIGINT, then shut it down cleanly."""
    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await broker.start()
    except BaseException:
        # a half-started broker must not stay registered in ZooKeeper, nor keep its
        # session's threads alive, after its event loop is gone
        await broker.abort()
        raise
    await stop.wait()
    logger.info("signal received; shutting down")
    await broker.stop()
