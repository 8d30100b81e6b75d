"""SimpleConsumer (docs/clients.md): read one partition from its leader, from an offset.

The consumer keeps the next offset to read. `fetch()` makes one FETCH (long-polling
up to `max_wait_ms` for at least `min_bytes`), verifies CRCs, drops a partial last
entry (the next fetch starts at it), and advances the offset past what it returns.
`fetch_columns()` and `batches()` hand out the same fetches whole, as columns
(`broker.common.columns`), without a Python object per message.

- A first message larger than `fetch_size` makes the consumer retry with a doubled
  size, up to `max_fetch_size`; beyond that `FetchSizeTooSmall` says how big it is.
- `OffsetOutOfRange` (retention deleted the data, or a stale offset) resets to the
  earliest or latest offset (`auto_offset_reset`), or raises with "error".
- a leader change (`NotLeaderForPartition`, `PartitionOffline`, `FencedLeaderEpoch`) or a
  lost connection refreshes metadata and retries until
  `retry_timeout_ms`, then raises `PartitionUnavailable`.
- An entry that cannot be decoded never stalls the consumer: the messages before it
  are returned first; then the entry is fetched once more (corruption in transit goes
  away) and, if still bad, `on_corrupt="raise"` (the default) raises
  `CorruptMessageError` naming topic, partition, offset and the way past it, while
  `on_corrupt="skip"` logs a warning, counts it in `skipped` and reads on after it.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator

from broker.client.cluster import LEADER_MOVED, ConnectionPool
from broker.client.metadata import ClusterMetadata, open_metadata
from broker.client.errors import FetchSizeTooSmall, PartitionUnavailable, confirm_corrupt
from broker.client.security import OPEN, ClientSecurity
from broker.client.settings import require_at_least
from broker.common.errors import BrokerShuttingDown, OffsetOutOfRange, UnknownTopic
from broker.common.columns import MessageColumns, decode_fetched
from broker.common.message import CorruptEntry, Message, first_entry_size
from broker.common.protocol import EARLIEST, LATEST, check_topic_name

logger = logging.getLogger(__name__)

RESETS = ("smallest", "largest", "error")
ON_CORRUPT = ("raise", "skip")
_RETRIABLE = (ConnectionError, OSError, BrokerShuttingDown, *LEADER_MOVED)


class SimpleConsumer:
    """Messages of one partition. `offset` may be any record's offset — inside a batch or
    a compressed set too (docs/architecture.md, "Offsets") — "smallest"/"earliest" or
    "largest"/"latest"; None means `auto_offset_reset`'s end."""

    def __init__(
        self,
        topic: str,
        partition: int,
        zookeeper: str | None = None,
        brokers: list[str] | str | None = None,
        *,
        offset: int | str | None = None,
        fetch_size: int = 1 << 20,
        max_fetch_size: int = 64 << 20,
        auto_offset_reset: str = "smallest",
        max_wait_ms: int = 100,
        min_bytes: int = 1,
        retry_timeout_ms: int = 10_000,
        retry_backoff_ms: int = 100,
        verify_crc: bool = True,
        on_corrupt: str = "raise",
        client_id: str = "logbus-consumer",
        metadata: ClusterMetadata | None = None,
        security: ClientSecurity = OPEN,
    ) -> None:
        if auto_offset_reset not in RESETS:
            raise ValueError(f"auto_offset_reset must be one of {', '.join(RESETS)}, not {auto_offset_reset!r}")
        if on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt must be one of {', '.join(ON_CORRUPT)}, not {on_corrupt!r}")
        require_at_least(locals(), {"partition": 0, "fetch_size": 1, "max_fetch_size": 1, "max_wait_ms": 0,
                                    "min_bytes": 0, "retry_timeout_ms": 0, "retry_backoff_ms": 0})
        self.on_corrupt = on_corrupt
        self.skipped = 0  # corrupt entries stepped over (on_corrupt="skip")
        self._suspect: int | None = None  # offset of an entry found corrupt once (fetched again before acting)
        self.topic = check_topic_name(topic)
        self.partition = partition
        self.fetch_size = fetch_size
        self.max_fetch_size = max(max_fetch_size, fetch_size)
        self.auto_offset_reset = auto_offset_reset
        self.max_wait_ms = max_wait_ms
        self.min_bytes = min_bytes
        self.retry_timeout = retry_timeout_ms / 1000
        self.retry_backoff = retry_backoff_ms / 1000
        self.verify_crc = verify_crc
        self._owns_metadata = metadata is None
        self.metadata = metadata or open_metadata(zookeeper, brokers, client_id, security=security)
        self.pool = ConnectionPool(self.metadata, client_id, timeout=max_wait_ms / 1000 + 30)
        self.high_watermark = -1
        if offset is None:
            offset = "largest" if auto_offset_reset == "largest" else "smallest"
        self.offset = self._resolve(offset)

    def __enter__(self) -> "SimpleConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.pool.close()
        if self._owns_metadata:
            self.metadata.close()

    # ---------------------------------------------------------------------- offsets

    def _resolve(self, offset: int | str) -> int:
        if isinstance(offset, int):
            return offset
        where = {"smallest": EARLIEST, "earliest": EARLIEST, "largest": LATEST, "latest": LATEST}.get(offset)
        if where is None:
            raise ValueError(f"offset must be a number, 'smallest' or 'largest', not {offset!r}")
        return self.offsets_before(where)[0]

    def offsets_before(self, time_ms: int, max_offsets: int = 1) -> list[int]:
        """OFFSETS at the leader: -1 latest, -2 earliest, else segment starts before a time."""
        return self._with_leader(lambda conn: conn.offsets(self.topic, self.partition, time_ms, max_offsets))

    def earliest(self) -> int:
        return self.offsets_before(EARLIEST)[0]

    def latest(self) -> int:
        return self.offsets_before(LATEST)[0]

    def seek(self, offset: int | str) -> None:
        """Continue reading at any record's offset (a `next_offset`), or 'smallest'/'largest'."""
        self.offset = self._resolve(offset)

    def _with_leader(self, call):
        """Run `call(connection)` at the partition's leader, following leader changes
        and waiting out a dead leader for up to `retry_timeout`."""
        deadline = time.monotonic() + self.retry_timeout
        while True:
            try:
                conn = self.pool.leader(self.topic, self.partition)
                try:
                    return call(conn)
                except _RETRIABLE:
                    self.pool.drop_connection(conn)
                    raise
            except (*_RETRIABLE, UnknownTopic) as exc:
                if time.monotonic() >= deadline:
                    if isinstance(exc, UnknownTopic):
                        raise
                    raise PartitionUnavailable(
                        f"partition {self.topic}-{self.partition} is unavailable: {exc}") from None
                logger.debug("%s-%d: %s; refreshing metadata", self.topic, self.partition, exc)
                time.sleep(self.retry_backoff)
                self.metadata.refresh(self.topic)

    # ------------------------------------------------------------------------ fetch

    def fetch(self, max_wait_ms: int | None = None) -> list[Message]:
        """One fetch at the current offset; advances past the messages returned. An
        empty list means nothing new arrived within the wait."""
        return self.fetch_columns(max_wait_ms).messages()

    def fetch_columns(self, max_wait_ms: int | None = None) -> MessageColumns:
        """`fetch` without a Python object per message: the whole fetch as columns
        (`broker.common.columns.MessageColumns`; `to_arrow` makes an Arrow record batch
        of it). Advances `offset` to its `next_offset`, the position to commit once
        every message of it is processed. No messages means nothing new arrived within
        the wait; corrupt entries and fetch sizes are handled as `fetch` handles them."""
        wait = self.max_wait_ms if max_wait_ms is None else max_wait_ms
        size = self.fetch_size
        while True:
            try:
                response = self._with_leader(
                    lambda conn: conn.fetch(self.topic, self.partition, self.offset, size, wait, self.min_bytes))
            except OffsetOutOfRange:
                self._reset()
                continue
            self.high_watermark = response.high_watermark
            data = response.messages
            columns = decode_fetched(data, response.set_offset, self.offset, self.verify_crc)
            if len(columns):
                self.offset = columns.next_offset
                return columns
            if columns.corrupt is not None:
                self._corrupt(columns.corrupt)
                continue
            needed = first_entry_size(data)
            if needed is None or needed <= len(data):
                return columns
            if size >= self.max_fetch_size:
                raise FetchSizeTooSmall(
                    f"the message at {self.topic}-{self.partition} offset {self.offset} is {needed} bytes, "
                    f"more than max_fetch_size={self.max_fetch_size}; raise max_fetch_size to read it")
            size = min(max(size * 2, 1), self.max_fetch_size)
            logger.info("message at %s-%d@%d needs %d bytes; fetching %d", self.topic, self.partition,
                        self.offset, needed, size)

    def _corrupt(self, corrupt: CorruptEntry) -> None:
        """The entry at the current offset cannot be decoded: fetch it again once, then
        raise or skip it (`on_corrupt`)."""
        self._suspect, error = confirm_corrupt(self._suspect, self.topic, self.partition, corrupt)
        if error is None:
            return
        if self.on_corrupt == "raise" or corrupt.next_offset is None:
            raise error
        self.skipped += 1
        logger.warning("skipping %s (%d skipped so far)", error, self.skipped)
        self.offset = corrupt.next_offset

    def _reset(self) -> None:
        if self.auto_offset_reset == "error":
            raise OffsetOutOfRange(
                f"offset {self.offset} is outside {self.topic}-{self.partition} "
                f"(earliest {self.earliest()}, latest {self.latest()})")
        old = self.offset
        self.offset = self.earliest() if self.auto_offset_reset == "smallest" else self.latest()
        logger.warning("offset %d of %s-%d is out of range; reset to %s offset %d", old, self.topic,
                       self.partition, self.auto_offset_reset, self.offset)

    # -------------------------------------------------------------------- iteration

    def __iter__(self) -> Iterator[Message]:
        """Messages up to the end of the partition: stops at the first fetch that
        brings nothing (after a long poll of `max_wait_ms`)."""
        return self.messages(idle_timeout=0)

    def messages(self, idle_timeout: float | None = None) -> Iterator[Message]:
        """Messages as they arrive; stops after `idle_timeout` seconds without any
        (None: never stops)."""
        for columns in self.batches(idle_timeout):
            yield from columns.messages()

    def batches(self, idle_timeout: float | None = None) -> Iterator[MessageColumns]:
        """`messages` a whole fetch at a time (`fetch_columns`), never empty: after
        taking one, `offset` is its `next_offset`. With `idle_timeout=0`, up to the end
        of the partition."""
        last = time.monotonic()
        while True:
            columns = self.fetch_columns()
            if len(columns):
                yield columns
                last = time.monotonic()
            elif idle_timeout is not None and time.monotonic() - last >= idle_timeout:
                return
