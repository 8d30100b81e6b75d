"""The asyncio server: framing, in-order responses, timeouts, start and clean stop.

A `Connection` parses frames straight from the socket buffer. The size of a frame is
checked before its bytes are buffered, so an absurd size costs nothing; a frame whose
header cannot be read closes only that connection. Responses go out in request order
(clients pipeline): immediate ones are written at once when nothing is ahead of them,
the rest queue behind a writer task that sends file regions with sendfile.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import signal
import socket
import struct
import time

from kazoo.client import KazooClient

from broker.config import BrokerConfig
from broker.errors import ErrorCode, InvalidRequest, LogbusError, RequestTooLarge
from broker.handlers import Part, RequestHandler
from broker.log.manager import LogManager, log_config
from broker.log.scheduler import FlushScheduler
from broker.log.segment import FileRegion
from broker.protocol import ApiKey, BrokerInfo, decode_request_header, error_response
from broker.registry import BrokerRegistry

logger = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
_CORRELATION = struct.Struct(">hhi")
MIN_REQUEST_SIZE = 10  # api_key, api_version, correlation_id, empty client_id


def api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api {api_key}"


class Connection(asyncio.Protocol):
    """One client connection. `_pending` holds, in request order, the responses not yet
    written: lists of parts, or tasks that will produce them."""

    def __init__(self, server: "Broker") -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._buffer = bytearray()
        self._pending: collections.deque = collections.deque()
        self._out: list[bytes] = []  # immediate responses of the current socket read
        self._writer: asyncio.Task | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._reading_paused = False
        self.last_active = time.monotonic()
        self.partial_since: float | None = None

    # ------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self.peer = "%s:%s" % (transport.get_extra_info("peername") or ("?", "?"))[:2]
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        for item in self._pending:
            if isinstance(item, asyncio.Task):
                item.cancel()
        self._pending.clear()
        if self._writer is not None:
            self._writer.cancel()
        self._can_write.set()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        buf = self._buffer
        buf += data
        pos, end = 0, len(buf)
        limit = self.server.config.socket_request_max_bytes
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < MIN_REQUEST_SIZE or size > limit:
                del buf[:pos]
                self._refuse_frame(size, limit)
                return
            if end - pos - 4 < size:
                break
            with memoryview(buf) as view:
                frame = bytes(view[pos + 4 : pos + 4 + size])
            pos += 4 + size
            self._dispatch(frame)
            if self.transport is None or self.transport.is_closing():
                break
        self.server.handler.write_unwritten()
        self._flush_out()
        del buf[:pos]
        self.partial_since = time.monotonic() if buf else None

    def _refuse_frame(self, size: int, limit: int) -> None:
        """A frame we will not read (it starts the buffer). If its header is here, say
        why; then close."""
        buf = self._buffer
        if size > limit and len(buf) >= 4 + _CORRELATION.size:
            correlation_id = _CORRELATION.unpack_from(buf, 4)[2]
            logger.warning("%s: request of %d bytes exceeds socket.request.max.bytes=%d; closing", self.peer, size, limit)
            self._send([error_response(correlation_id, ErrorCode.REQUEST_TOO_LARGE,
                                       str(RequestTooLarge(f"request of {size} bytes exceeds socket.request.max.bytes={limit}")))])
        elif size > limit:
            return  # wait for the header's few bytes so the client learns why
        else:
            logger.warning("%s: impossible frame size %d; closing", self.peer, size)
        self._buffer.clear()
        self.close()

    # ------------------------------------------------------------------- requests

    def _dispatch(self, frame: bytes) -> None:
        try:
            header, reader = decode_request_header(frame)
        except InvalidRequest as exc:
            logger.warning("%s: unreadable request header (%s); closing", self.peer, exc)
            self.close()
            return
        try:
            result = self.server.handler.handle(header, reader)
        except LogbusError as exc:
            logger.warning("%s: %s request %d refused: %s", self.peer, api_name(header.api_key), header.correlation_id, exc)
            result = [error_response(header.correlation_id, exc.code, str(exc))]
        except Exception:
            logger.exception("%s: request %d failed", self.peer, header.correlation_id)
            result = [error_response(header.correlation_id, ErrorCode.UNKNOWN, "internal broker error; see its log")]
        if result is None:
            return
        if isinstance(result, list):
            if not self._pending and all(isinstance(p, bytes) for p in result):
                self._out += result  # written together after this read (`_flush_out`)
                return
            self._pending.append(result)
        else:
            self._pending.append(asyncio.ensure_future(self._guard(header.correlation_id, header.api_key, result)))
        if len(self._pending) >= self.server.config.max_in_flight_requests and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write_pending())  # runs after `_flush_out`

    async def _guard(self, correlation_id: int, api_key: int, coroutine) -> list[Part] | None:
        try:
            return await coroutine
        except LogbusError as exc:
            logger.warning("%s: %s request %d refused: %s", self.peer, api_name(api_key), correlation_id, exc)
            return [error_response(correlation_id, exc.code, str(exc))]
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("%s: request %d failed", self.peer, correlation_id)
            return [error_response(correlation_id, ErrorCode.UNKNOWN, "internal broker error; see its log")]

    async def _write_pending(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending and self.transport is not None and not self.transport.is_closing():
            item = self._pending[0]
            parts = await item if isinstance(item, asyncio.Task) else item
            for part in parts or ():
                if isinstance(part, FileRegion):
                    if part.length:
                        await loop.sendfile(self.transport, part.file, part.position, part.length)
                else:
                    self.transport.write(part)
            await self._can_write.wait()
            self._pending.popleft()
            self.last_active = time.monotonic()
            if self._reading_paused and len(self._pending) < self.server.config.max_in_flight_requests // 2:
                self._reading_paused = False
                self.transport.resume_reading()

    def _flush_out(self) -> None:
        """One write for all immediate answers to one socket read: one syscall per answer
        was a third of the broker's time with pipelined acks=1 producers."""
        if self._out:
            out, self._out = self._out, []
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _send(self, parts: list[bytes]) -> None:
        self._flush_out()
        for part in parts:
            self.transport.write(part)

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
        )
        self.registry = BrokerRegistry(
            self.zk, BrokerInfo(config.broker_id, config.host, config.port), self._on_assignment,
            config.zookeeper_session_timeout_ms,
        )
        self.handler = RequestHandler(config, self.logs, self.scheduler, self.registry)
        self.connections: set[Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task] = []

    def _on_assignment(self, topic: str, assignment: dict[int, list[int]]) -> None:
        for partition, replicas in assignment.items():
            if replicas[0] == self.config.broker_id:
                self.logs.get_or_create(topic, partition)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.logs.load)
        await loop.run_in_executor(None, self.zk.start, self.config.zookeeper_connection_timeout_ms / 1000)
        await loop.run_in_executor(None, self.registry.start)
        self._server = await loop.create_server(
            lambda: Connection(self), self.config.host, self.config.port, reuse_address=True, backlog=512
        )
        await loop.run_in_executor(None, self.registry.register)
        self._tasks = [
            asyncio.ensure_future(self._every(self.config.log_retention_check_interval_ms, self._retention)),
            asyncio.ensure_future(self._every(1000, self._close_stale_connections)),
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

    async def _close_stale_connections(self) -> None:
        now = time.monotonic()
        for conn in list(self.connections):
            if conn.partial_since is not None and (now - conn.partial_since) * 1000 > self.config.request_read_timeout_ms:
                logger.warning("%s: request not completed within %d ms; closing", conn.peer, self.config.request_read_timeout_ms)
                conn.close()
            elif not conn.busy and (now - conn.last_active) * 1000 > self.config.connections_max_idle_ms:
                logger.info("%s: idle for %d ms; closing", conn.peer, self.config.connections_max_idle_ms)
                conn.close()

    async def stop(self) -> None:
        """Deregister, stop serving, flush every log, mark the shutdown clean."""
        loop = asyncio.get_running_loop()
        self.handler.shutting_down = True
        for task in self._tasks:
            task.cancel()
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
    await broker.start()
    await stop.wait()
    logger.info("signal received; shutting down")
    await broker.stop()
