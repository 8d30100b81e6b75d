"""When logs are flushed, on the event loop's side
(docs/storage.md, "Append, roll, flush").

fsync runs in worker threads so the event loop never waits on the disk. Per
partition, at most one flush runs at a time; every producer waiting with `acks=-1`
and every long-polling fetch is answered by the flush that covers it (group commit):
durable throughput does not collapse to one fsync per request.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from broker.common.errors import StorageError
from broker.server.log.log import Log

logger = logging.getLogger(__name__)


class PartitionFlusher:
    """Flush state of one partition; used only from the event loop thread."""

    def __init__(self, log: Log, executor: ThreadPoolExecutor) -> None:
        self.log = log
        self._executor = executor
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._advanced = asyncio.Event()
        self._running = False
        self._timer: asyncio.TimerHandle | None = None
        self._wanted = 0  # an offset someone waits to see on disk without a future here
        self.on_flushed: Callable[[int], None] | None = None  # a replicated partition's HW update

    def appended(self) -> None:
        """Called after every append: flush now if M messages are waiting, else make
        sure a timer flushes within S milliseconds."""
        log = self.log
        if log.unflushed_messages >= log.config.flush_interval_messages:
            self.flush_soon()
        elif self._timer is None and not self._running:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(log.config.flush_interval_ms / 1000, self.flush_soon)

    def flush_soon(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._running:
            self._running = True
            asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                before = self.log.flushed_offset
                try:
                    flushed = await loop.run_in_executor(self._executor, self.log.flush)
                except (OSError, StorageError) as exc:  # the log directory logged it; waiters get StorageError
                    logger.error("flush of %s failed: %s", self.log.name, exc)
                    self._fail_waiters(exc)
                    return
                if flushed > before:
                    self._wake(flushed)
                    if self.on_flushed is not None:
                        self.on_flushed(flushed)
                if not (self._waiters or self.log.flush_due() or self.log.flushed_offset < self._wanted):
                    return
        finally:
            self._running = False
            if self.log.unflushed_messages and self._timer is None:
                self.appended()

    def _wake(self, flushed: int) -> None:
        still = []
        for offset, future in self._waiters:
            if offset <= flushed:
                if not future.done():
                    future.set_result(flushed)
            else:
                still.append((offset, future))
        self._waiters = still
        self.signal_advanced()

    def signal_advanced(self) -> None:
        """Wake long-polling fetches: what consumers may read has grown (a flush, or a
        replicated partition's high watermark)."""
        advanced, self._advanced = self._advanced, asyncio.Event()
        advanced.set()

    def _fail_waiters(self, exc: Exception) -> None:
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(exc)
        self._waiters = []

    async def wait_flushed(self, offset: int) -> None:
        """Return once everything below `offset` is on disk (acks=-1)."""
        if self.log.flushed_offset >= offset:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((offset, future))
        self.flush_soon()
        await future

    def flush_to(self, offset: int) -> None:
        """Flush until everything below `offset` is on disk, for a waiter that is not
        a future here (a replicated partition's acks=-1 waits for the high watermark,
        which the leader's own flushed end bounds). A flush already running when the
        request comes may not cover it: the loop goes on until one does, rather than
        leave the rest to the `log.flush.interval.ms` timer."""
        if self.log.flushed_offset >= offset:
            return
        self._wanted = max(self._wanted, offset)
        self.flush_soon()

    def advanced(self) -> asyncio.Event:
        """An event set by the next flush that moves the high watermark."""
        return self._advanced


class FlushScheduler:
    """Flushers of all partitions of the broker, and the final flush on shutdown."""

    def __init__(self, threads: int = 4) -> None:
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="flush")
        self._flushers: dict[Log, PartitionFlusher] = {}

    def flusher(self, log: Log) -> PartitionFlusher:
        flusher = self._flushers.get(log)
        if flusher is None:
            flusher = self._flushers[log] = PartitionFlusher(log, self.executor)
        return flusher

    def forget(self, log: Log, error: Exception) -> None:
        """A removed log (its topic deleted): no more flushes of it; its acks=-1 waiters
        get `error`, long polls on it wake up."""
        flusher = self._flushers.pop(log, None)
        if flusher is not None:
            if flusher._timer is not None:
                flusher._timer.cancel()
                flusher._timer = None
            flusher._fail_waiters(error)
            flusher.signal_advanced()

    async def wait_for_data(self, logs_and_offsets: list[tuple[Log, int, int]], timeout: float) -> None:
        """Long poll: return when any (log, offset, min_bytes) has min_bytes flushed past
        offset, or after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            events = []
            for log, offset, min_bytes in logs_and_offsets:
                if log.visible_offset - offset >= max(min_bytes, 1):
                    return
                events.append(self.flusher(log).advanced())
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            waits = [asyncio.ensure_future(e.wait()) for e in events]
            try:
                await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True)
