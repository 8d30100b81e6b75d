"""The group's fetcher thread: keeps the streams of owned partitions fed.

One thread serves every partition a consumer owns. Each round it sends one MULTIFETCH
to every leader at once (pipelined over the brokers, each a long poll of `max_wait_ms`
for `min_bytes`), then reads the answers and puts each partition's messages, decoded into columns
(`broker.common.columns`) as one `Chunk`, on its stream's queue. A partition whose stream already holds `queued_chunks`
chunks is not fetched (back-pressure); a partition without a live leader is skipped
until it has one again; a fetched message bigger than the fetch size doubles that
partition's fetch size up to `max_fetch_size`.

`assign()` replaces the work at a rebalance; chunks carry the generation they were
fetched in, and results of an older generation are thrown away.

An entry that cannot be decoded never stalls a stream: the messages before it are
delivered, the entry is fetched once more (corruption in transit goes away), and if it
is still bad it is skipped (`offset + 4 + size`) with a warning naming the partition and
offset, and counted in `skipped`. Only an entry whose size field is garbage — there is
no way past it — ends the partition's stream with `CorruptMessageError`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from broker.client.cluster import ConnectionPool
from broker.client.metadata import ClusterMetadata
from broker.client.errors import FetchSizeTooSmall, confirm_corrupt
from broker.client.stream import Chunk, MessageStream
from broker.common.errors import InvalidRequest, LogbusError, OffsetOutOfRange, error_for
from broker.common.columns import decode_fetched, empty_columns
from broker.common.message import CorruptEntry, first_entry_size
from broker.common.protocol import EARLIEST, FETCH_VERSION, LATEST, ApiKey, FetchRequest, MultiFetchRequest, decode_multifetch, raise_for_error

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class PartitionFetch:
    """Fetch state of one owned partition. `offset` None: not known yet (a new group
    whose partition's leader is down); it is resolved by `auto_offset_reset`."""

    topic: str
    partition: int
    stream: MessageStream
    offset: int | None
    fetch_size: int
    suspect: int | None = None  # offset of an entry found corrupt once (fetched again before skipping)


class Fetcher(threading.Thread):
    """`_lock` guards `_work` and `_generation`, which `assign` replaces."""

    def __init__(self, metadata: ClusterMetadata, client_id: str, *, fetch_size: int, max_fetch_size: int,
                 max_wait_ms: int, auto_offset_reset: str, queued_chunks: int, on_offset_reset=None) -> None:
        super().__init__(name=f"{client_id}-fetcher", daemon=True)
        self.metadata = metadata
        self.pool = ConnectionPool(metadata, client_id, timeout=max_wait_ms / 1000 + 30)
        self.fetch_size = fetch_size
        self.max_fetch_size = max(max_fetch_size, fetch_size)
        self.max_wait_ms = max_wait_ms
        self.auto_offset_reset = auto_offset_reset
        self.queued_chunks = queued_chunks
        self.on_offset_reset = on_offset_reset
        self._lock = threading.Lock()
        self._work: list[PartitionFetch] = []
        self._generation = 0
        self._stopped = threading.Event()
        self.wake = threading.Event()
        self.skipped: dict[tuple[str, int], int] = {}  # corrupt entries skipped, per partition

    @property
    def skipped_entries(self) -> int:
        return sum(self.skipped.values())

    def assign(self, work: list[PartitionFetch], generation: int) -> None:
        with self._lock:
            self._work = work
            self._generation = generation
        self.wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self.wake.set()

    def current(self, generation: int) -> bool:
        return generation == self._generation

    # --------------------------------------------------------------------- rounds

    def run(self) -> None:
        try:
            while not self._stopped.is_set():
                try:
                    fetched = self._round()
                except Exception:  # keep feeding the streams; the log says what went wrong
                    logger.exception("fetch round failed")
                    fetched = False
                if not fetched:
                    self.wake.wait(0.1)
                    self.wake.clear()
        finally:
            self.pool.close()

    def _round(self) -> bool:
        """One MULTIFETCH per leader; False when there was nothing to fetch."""
        with self._lock:
            work, generation = list(self._work), self._generation
        by_leader: dict[int, list[PartitionFetch]] = {}
        for f in work:
            if f.stream.pending_chunks() >= self.queued_chunks:
                continue
            leader = (self.metadata.partitions(f.topic) or {}).get(f.partition, -1)
            if leader < 0:
                continue
            if f.offset is None and not self._resolve(f, leader):
                continue
            by_leader.setdefault(leader, []).append(f)
        sent = []
        for leader, fetches in by_leader.items():
            request = MultiFetchRequest([FetchRequest(f.topic, f.partition, f.offset, f.fetch_size, self.max_wait_ms, 1)
                                         for f in fetches])
            try:
                conn = self.pool.get(leader)
                conn.send(ApiKey.MULTIFETCH, request.encode(), api_version=FETCH_VERSION)
                sent.append((leader, conn, fetches))
            except (ConnectionError, OSError) as exc:
                self._lost(leader, fetches, exc)
        for leader, conn, fetches in sent:
            try:
                error_code, reader = conn.receive()
                raise_for_error(error_code, reader)
                results = decode_multifetch(reader)
            except (ConnectionError, OSError, LogbusError) as exc:
                self._lost(leader, fetches, exc)
                continue
            for f, result in zip(fetches, results):
                self._take(f, result, generation)
        return bool(sent)

    def _lost(self, leader: int, fetches: list[PartitionFetch], exc: BaseException) -> None:
        logger.info("fetch from broker %d failed: %s; refreshing metadata", leader, exc)
        self.pool.drop(leader)
        for topic in {f.topic for f in fetches}:
            self.metadata.refresh(topic)

    def _resolve(self, f: PartitionFetch, leader: int) -> bool:
        where = LATEST if self.auto_offset_reset == "largest" else EARLIEST
        try:
            f.offset = self.pool.get(leader).offsets(f.topic, f.partition, where)[0]
        except (ConnectionError, OSError, LogbusError) as exc:
            logger.info("cannot find the %s offset of %s-%d yet: %s", self.auto_offset_reset, f.topic, f.partition, exc)
            self.pool.drop(leader)
            return False
        if self.on_offset_reset is not None:
            self.on_offset_reset(f)
        return True

    def _take(self, f: PartitionFetch, result, generation: int) -> None:
        if not self.current(generation):
            return
        if result.error_code != 0:
            error = error_for(result.error_code, result.message)
            if isinstance(error, InvalidRequest):  # a request the broker refuses: retrying cannot help
                logger.error("fetch of %s-%d at %s refused: %s", f.topic, f.partition, f.offset, error)
                self._end(f, generation, error)
                return
            if isinstance(error, OffsetOutOfRange):
                if self.auto_offset_reset == "error":
                    self._end(f, generation, error)
                    return
                logger.warning("offset %s of %s-%d is out of range; resetting to %s", f.offset, f.topic, f.partition,
                               self.auto_offset_reset)
                f.offset = None
            else:
                logger.info("fetch of %s-%d refused: %s", f.topic, f.partition, error)
                self.metadata.refresh(f.topic)
            return
        data = result.value.messages
        columns = decode_fetched(data, result.value.set_offset, f.offset)
        if not len(columns) and columns.corrupt is not None:
            self._corrupt(f, columns.corrupt, generation)
            return
        if len(columns):
            f.offset = columns.next_offset
            f.fetch_size = self.fetch_size
            f.stream.queue.put(Chunk(generation, f.topic, f.partition, columns))
            return
        needed = first_entry_size(data)
        if needed is not None and needed > len(data):
            if f.fetch_size >= self.max_fetch_size:
                self._end(f, generation, FetchSizeTooSmall(
                    f"the message at {f.topic}-{f.partition} offset {f.offset} is {needed} bytes, more than "
                    f"max_fetch_size={self.max_fetch_size}"))
                return
            f.fetch_size = min(f.fetch_size * 2, self.max_fetch_size)

    def _corrupt(self, f: PartitionFetch, corrupt: CorruptEntry, generation: int) -> None:
        """The entry at `f.offset` cannot be decoded: fetch it again once, then skip it."""
        f.suspect, error = confirm_corrupt(f.suspect, f.topic, f.partition, corrupt)
        if error is None:
            return
        if corrupt.next_offset is None:
            logger.error("%s; the stream of %s-%d ends here", error, f.topic, f.partition)
            self._end(f, generation, error)
            return
        key = (f.topic, f.partition)
        self.skipped[key] = self.skipped.get(key, 0) + 1
        logger.warning("skipping corrupt entry in %s-%d at offset %d (%s); next offset %d; %d skipped in this partition",
                       f.topic, f.partition, corrupt.offset, corrupt.reason, corrupt.next_offset, self.skipped[key])
        f.offset = corrupt.next_offset

    def _end(self, f: PartitionFetch, generation: int, error: BaseException) -> None:
        """Stop fetching a partition; its stream raises `error` after what it already holds."""
        f.stream.queue.put(Chunk(generation, f.topic, f.partition, empty_columns(f.offset or 0), error))
        with self._lock:
            self._work = [w for w in self._work if w is not f]
