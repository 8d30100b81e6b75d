"""The leader's side of replication requests (docs/replication.md, "Leader"): a
follower's REPLICA_FETCH as a fetch session (Kafka's KIP-227) — a full request names
every partition it follows here, later ones only those whose position moved — and
LEADER_EPOCH_END. Each fetch is recorded on its `Partition` (follower positions, high
watermark) and may let the follower join the ISR (`IsrChanges.expand`).

Used only from the event loop thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from broker.common.errors import (
    ErrorCode, FencedLeaderEpoch, InvalidRequest, LogbusError, NotLeaderForPartition, OffsetOutOfRange,
    UnknownPartition,
)
from broker.common.protocol import (
    Body, LeaderEpochEndRequest, LeaderEpochEndResponse, PartitionResult, ReplicaFetchPartition, ReplicaFetchRequest,
    ReplicaFetchResponse, encode_results,
)
from broker.server.config import BrokerConfig
from broker.server.log.segment import EMPTY
from broker.server.replication.isr import IsrChanges
from broker.server.replication.partition import Partition, wait_for_any_append

Key = tuple[str, int]

# Enum members as constants on a hot path (docs/architecture.md, "Enum members on hot paths").
_OK = ErrorCode.NONE


@dataclass
class SessionEntry:
    """One partition of a follower's fetch session, as the leader keeps it: the fetch it
    last named, the refusal of that fetch if any, and the (high watermark, epoch) last
    answered, so that an unchanged partition is left out of the answer."""

    fetch: ReplicaFetchPartition
    error: PartitionResult | None = None
    told: tuple[int, int] | None = None


class FetchSessions:
    """Every follower's fetch session with this broker, and the answers to them."""

    def __init__(self, config: BrokerConfig, partitions: dict[Key, Partition], isr: IsrChanges) -> None:
        self.config = config
        self.partitions = partitions  # the replica manager's, shared: roles change there
        self.isr = isr
        self._by_follower: dict[int, dict[Key, SessionEntry]] = {}  # follower id -> its fetch session

    def _led_for_replication(self, topic: str, partition: int, epoch: int) -> Partition:
        part = self.partitions.get((topic, partition))
        if part is None:
            raise UnknownPartition(f"broker {self.config.broker_id} has no replica of {topic}-{partition}")
        if part.is_leader and epoch < part.epoch:
            raise FencedLeaderEpoch(f"epoch {epoch} of {topic}-{partition} is older than the leader's {part.epoch}")
        if not part.is_leader or epoch > part.epoch:
            raise NotLeaderForPartition(
                f"broker {self.config.broker_id} does not lead {topic}-{partition} in epoch {epoch} "
                f"(it knows epoch {part.epoch}, leader {part.state.leader})")
        return part

    async def replica_fetch(self, req: ReplicaFetchRequest) -> Body:
        """A follower's fetch of every partition it follows here. A full request starts
        its session; an incremental one updates the partitions it names, and the others
        keep their last fetch (still at the leader's end: caught up now). Answered at
        once when any session partition has bytes, an error or a new high watermark for
        the follower, else after a long poll until one is appended to. Partitions answer
        separately: one this broker no longer leads does not hold up the others."""
        session = self._fetch_session(req)
        now = time.monotonic()
        named = set()
        for fetch in req.partitions:
            key = (fetch.topic, fetch.partition)
            named.add(key)
            entry = session.get(key)
            if entry is None:
                session[key] = entry = SessionEntry(fetch)
            entry.fetch, entry.error = fetch, None
            try:
                self._record(self._led_for_replication(fetch.topic, fetch.partition, fetch.leader_epoch),
                                   req.replica_id, fetch)
            except LogbusError as exc:
                entry.error = PartitionResult.failed(exc)
        for key in session.keys() - named:
            self._still_caught_up(req.replica_id, session[key], now)
        answer = self._session_answer(req.replica_id, session)
        if not answer and req.max_wait_ms > 0:
            waiting = [part for key in session if (part := self.partitions.get(key)) is not None and part.is_leader]
            await wait_for_any_append(waiting, min(req.max_wait_ms, self.config.replica_fetch_wait_max_ms) / 1000)
            answer = self._session_answer(req.replica_id, session)
        return encode_results([result for _, result in answer], [key for key, _ in answer])

    def _fetch_session(self, req: ReplicaFetchRequest) -> dict[Key, SessionEntry]:
        if req.full:
            session = self._by_follower[req.replica_id] = {}
            return session
        session = self._by_follower.get(req.replica_id)
        if session is None:
            raise InvalidRequest(f"broker {self.config.broker_id} has no fetch session of replica {req.replica_id} "
                                 "(restarted?): send a full fetch")
        return session

    def _still_caught_up(self, replica_id: int, entry: SessionEntry, now: float) -> None:
        """A session partition the follower did not name: it is where it last said, and
        the last answer had no bytes for it — so it is caught up if the log has not
        grown since. One out of the ISR is recorded in full: it may join now. (Runs for
        every idle partition of every fetch: attribute reads only.)"""
        part = self.partitions.get((entry.fetch.topic, entry.fetch.partition))
        if part is None or not part.is_leader or part.epoch != entry.fetch.leader_epoch:
            return  # answered as an error
        position = part.followers.get(replica_id)
        if position is None or replica_id not in part.isr:
            self._record(part, replica_id, entry.fetch)
        elif position.fetch_offset >= part.log.end_offset:
            position.caught_up_at = now

    def _session_answer(self, replica_id: int, session: dict[Key, SessionEntry]) -> list[tuple[Key, PartitionResult]]:
        """The partitions with something to tell the follower: bytes, an error, or a high
        watermark or epoch it was not told yet."""
        answer = []
        for key, entry in session.items():
            part = self.partitions.get(key)
            if (entry.error is None and part is not None and part.is_leader and part.epoch == entry.fetch.leader_epoch
                    and entry.fetch.fetch_offset == part.log.end_offset
                    and entry.told == (part.high_watermark, part.epoch)):
                continue  # the common case, kept cheap: nothing new
            result = entry.error or self._replica_read(replica_id, entry.fetch)
            if result.error_code == _OK:
                told = (result.value.high_watermark, result.value.leader_epoch)
                if not len(result.value.messages) and told == entry.told:
                    continue
                entry.told = told
            answer.append((key, result))
        return answer

    def _replica_read(self, replica_id: int, fetch: ReplicaFetchPartition) -> PartitionResult:
        try:
            part = self._led_for_replication(fetch.topic, fetch.partition, fetch.leader_epoch)
            log = part.log
            if not log.start_offset <= fetch.fetch_offset <= log.end_offset:
                raise OffsetOutOfRange(f"replica {replica_id} fetches {part.name} at {fetch.fetch_offset}, outside "
                                       f"[{log.start_offset}, {log.end_offset}]: it must truncate first")
            region = EMPTY
            if fetch.fetch_offset < log.end_offset:
                log.write_unwritten()
                region = log.read(fetch.fetch_offset, fetch.max_bytes, upto=log.end_offset)
        except LogbusError as exc:
            return PartitionResult.failed(exc)
        return PartitionResult(_OK, ReplicaFetchResponse(part.high_watermark, part.epoch, region))

    def _record(self, part: Partition, replica_id: int, fetch: ReplicaFetchPartition) -> None:
        if part.record_fetch(replica_id, fetch.fetch_offset, fetch.flushed_offset):
            self.isr.expand(part, replica_id)

    def leader_epoch_end(self, req: LeaderEpochEndRequest) -> Body:
        part = self.partitions.get((req.topic, req.partition))
        if part is None or not part.is_leader:
            raise NotLeaderForPartition(f"broker {self.config.broker_id} does not lead {req.topic}-{req.partition}")
        epoch, end = part.log.epochs.end_offset_for(req.leader_epoch, part.log.end_offset)
        return [LeaderEpochEndResponse(epoch, end).encode()]
