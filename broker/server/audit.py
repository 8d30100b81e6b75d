"""The brokers' record counts (`broker.common.auditcounts`; docs/provider.md, "The
audit", tier `broker`): every `audit.count.interval.ms` the leader of each partition
counts the committed records past the partition's node's `upto` — below the visible
offset (the high watermark of a replicated partition, the flushed end of one with one
replica) — per window of their timestamp, and writes the node back conditionally on its
version.

Why this is exact across leader changes: committed records are never truncated and are
the same bytes on every in-sync replica, so counting `[upto, visible)` on any leader's
copy adds the same numbers; and a write names the version it read, so two brokers that
both believe they lead (a deposed leader that has not heard yet) cannot both add the
same range — the second write fails, re-reads the node and continues from the winner's
`upto`. Counting reads the log in chunks off the event loop, at most
`audit.count.max.bytes` per partition and round, so a large backlog (a first start on
old logs) is caught up over several rounds without holding a thread long.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError, SessionExpiredError

from broker.common.auditcounts import WINDOW_MS, PartitionCounts, audit_path
from broker.common.errors import LogbusError
from broker.common.message import first_entry_size, whole_entries
from broker.common.zklayout import topic_path
from broker.server.config import BrokerConfig
from broker.server.log.log import Log
from broker.server.log.lookups import chunks
from broker.server.log.segment import Segment

if TYPE_CHECKING:
    from broker.server.handlers import RequestHandler

logger = logging.getLogger(__name__)

Clock = Callable[[], int]


def wall_ms() -> int:
    return int(time.time() * 1000)


def led_logs(handler: "RequestHandler") -> list[Log]:
    """The logs of the partitions this broker leads and may take produce for (on the
    event loop: the replication state lives there)."""
    me, logs = handler.config.broker_id, []
    for topic, assignment in handler.registry.view.topics.items():
        for partition, replicas in assignment.items():
            if me in replicas:
                try:
                    logs.append(handler.led(topic, partition)[0])
                except LogbusError:  # a follower, fenced, or not yet told its role
                    pass
    return logs


class RecordCounter:
    """Counts the records of the partitions this broker leads into their ZooKeeper
    nodes. `advance` runs in an executor thread, one round at a time (the broker's
    background job awaits it); `_known` keeps the node this broker last read or wrote,
    with its version, so a round with nothing new reads nothing from ZooKeeper — a stale
    entry only costs one failed conditional write. It is kept per `Log` object: a topic
    deleted and created again is a new log, counted afresh. A partition's first node is
    created only while its topic exists (one transaction), so a round that overlaps the
    topic's deletion cannot leave its old counts behind for a new topic of that name."""

    def __init__(self, zk: KazooClient, retention_ms: int, max_bytes: int, excluded: tuple[str, ...] = (),
                 led: Callable[[], list[Log]] = list, clock: Clock = wall_ms, window_ms: int = WINDOW_MS) -> None:
        self.zk, self.retention_ms, self.max_bytes = zk, retention_ms, max_bytes
        self.excluded, self.led, self.clock, self.window_ms = frozenset(excluded), led, clock, window_ms
        self._known: dict[Log, tuple[PartitionCounts, int]] = {}

    @classmethod
    def of(cls, config: BrokerConfig, zk: KazooClient, led: Callable[[], list[Log]]) -> "RecordCounter":
        return cls(zk, config.audit_window_retention_ms, config.audit_count_max_bytes, config.audit_excluded_topics,
                   led)

    async def round(self) -> None:
        """The broker's background job: the led partitions chosen on the event loop,
        counted in the executor."""
        await asyncio.get_running_loop().run_in_executor(None, self.advance_all, self.led())

    def advance_all(self, logs: list[Log]) -> None:
        """One round over the led partitions' logs; a failure of one is logged and
        retried next round, never stops the others. Logs no longer led (or deleted) leave
        `_known`: it would keep a deleted topic's logs for the broker's life."""
        current = set(logs)
        self._known = {log: known for log, known in self._known.items() if log in current}
        for log in logs:
            if log.topic in self.excluded:
                continue
            try:
                self.advance(log)
            except (ConnectionLoss, SessionExpiredError) as exc:  # kazoo reconnects; so does the next round
                logger.warning("counting records for the audit paused: ZooKeeper %s", type(exc).__name__)
                return
            except Exception:
                logger.exception("%s: counting its records for the audit failed; retrying next round", log.name)

    def advance(self, log: Log, attempts: int = 3) -> bool:
        """Count `log`'s committed records past its node's `upto` (bounded by
        `max_bytes`) and write the node; True when it was written. A write that lost
        to another broker's re-reads and counts again from the winner's `upto`."""
        key = (log.topic, log.partition)
        visible = log.visible_offset
        known = self._known.get(log)
        if known is not None and known[0].upto >= visible:
            return False
        for _ in range(attempts):
            counts, version = known if known is not None else self._read(log)
            if counts.upto >= visible:
                self._known[log] = (counts, version)
                return False
            counts = self._counted(log, counts, visible)
            try:
                if version < 0:
                    if not self._create(key, counts):
                        return False  # the topic was deleted
                    version = 0
                else:
                    version = self.zk.set(audit_path(*key), counts.encode(), version=version).version
            except (BadVersionError, NodeExistsError, NoNodeError):
                self._known.pop(log, None)  # another broker wrote first: read its node
                known = None
                continue
            self._known[log] = (counts, version)
            return True
        return False

    def _create(self, key: tuple[str, int], counts: PartitionCounts) -> bool:
        """Create the partition's node if its topic still exists; False if it does not."""
        path = audit_path(*key)
        self.zk.ensure_path(path.rsplit("/", 1)[0])
        transaction = self.zk.transaction()
        transaction.check(topic_path(key[0]), -1)
        transaction.create(path, counts.encode())
        topic, created = transaction.commit()
        if isinstance(topic, NoNodeError):
            return False
        if isinstance(created, Exception):
            raise created
        return True

    def _read(self, log: Log) -> tuple[PartitionCounts, int]:
        """The node and its version; a new partition's counts start at the log's start
        (version -1: to be created)."""
        try:
            data, stat = self.zk.get(audit_path(log.topic, log.partition))
        except NoNodeError:
            return PartitionCounts(log.start_offset, log.start_offset), -1
        return PartitionCounts.decode(data), stat.version

    def _counted(self, log: Log, counts: PartitionCounts, visible: int) -> PartitionCounts:
        """A copy of `counts` advanced over `[upto, visible)`: what the log's tally knows
        taken from it, the rest read — at most `max_bytes` of it (whole entries: `chunks`
        cuts at entry boundaries, and so does the visible offset). Offsets retention
        deleted before they were counted are named in `skipped`."""
        counts = dataclasses.replace(counts, windows=dict(counts.windows), skipped=list(counts.skipped))
        segments = log.segments
        start = segments[0].base_offset
        if counts.upto < start:
            logger.warning("%s: retention deleted offsets [%d, %d) before they were counted for the audit",
                           log.name, counts.upto, start)
            counts.skipped.append((counts.upto, start))
            counts.upto = start
        oldest = self.clock() - self.retention_ms
        oldest -= oldest % self.window_ms
        room = self.max_bytes
        try:
            for piece in log.tally.pieces(segments, counts.upto, visible, self.window_ms):
                if piece.window is not None:
                    counts.count_known(piece.start, piece.end, piece.window, piece.records, oldest)
                    continue
                room = self._read_gap(segments, counts, piece.end, oldest, room)
                if room <= 0 or counts.upto < piece.end:
                    break
        except FileNotFoundError:  # retention took a segment while it was read: what was counted stands
            pass
        log.tally.counted = counts.upto
        counts.prune(oldest)
        return counts

    def _read_gap(self, segments: tuple[Segment, ...], counts: PartitionCounts, end: int, oldest: int, room: int) -> int:
        """Count the entries of `[upto, end)` from the log's bytes, at most `room` of them
        (the last entries whole: at least one); returns the room left."""
        for offset, data in chunks(segments, counts.upto, end):
            if len(data) > room:  # the round's last entries: at least one, whole; the chunk's rest is not counted
                counts.count_entries(data[:whole_entries(data[:room]) or first_entry_size(data)], offset, oldest,
                                     self.window_ms)
                return 0
            counts.count_entries(data, offset, oldest, self.window_ms)
            room -= len(data)
            if room <= 0:
                break
        return room
