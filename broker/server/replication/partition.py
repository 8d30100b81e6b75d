"""One replicated partition on this broker: its role (leader or follower) in a leader
epoch, and — as leader — what each follower has, the in-sync replicas and the high
watermark (docs/replication.md).

Used only from the event loop thread. ZooKeeper writes (ISR changes) are made by the
`ReplicaManager`; this class decides them and applies them once they are written.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass

from broker.common.errors import LogbusError, NotEnoughReplicasAfterAppend, NotLeaderForPartition, RequestTimedOut
from broker.common.zklayout import PartitionState
from broker.server.log.log import Log
from broker.server.log.scheduler import PartitionFlusher

logger = logging.getLogger(__name__)


class Role(enum.Enum):
    NONE = "none"  # not yet told, or the partition is offline
    LEADER = "leader"
    FOLLOWER = "follower"


# Enum members as constants on a hot path (docs/architecture.md, "Enum members on hot paths").
_LEADER = Role.LEADER


@dataclass
class FollowerPosition:
    """What the leader knows of one follower, from its last REPLICA_FETCH."""

    fetch_offset: int = -1  # the follower's log end
    flushed_offset: int = -1  # the follower's flushed end: what counts for the HW
    caught_up_at: float = 0.0  # last time it had everything the leader had (monotonic)
    last_fetch_at: float = 0.0
    end_at_last_fetch: int = -1  # the leader's log end when it answered the previous fetch


@dataclass
class Committer:
    """An acks=-1 answer waiting for the high watermark to reach `offset` (its batch's
    end), bound to the leader epoch in which the batch was appended."""

    offset: int
    epoch: int
    future: asyncio.Future


class Partition:
    def __init__(self, log: Log, broker_id: int, replicas: list[int], flusher: PartitionFlusher,
                 min_insync: int, leader_flush_first: bool = False) -> None:
        self.log = log
        # the HW waits for the leader's own flush too (`replica.visibility=all-flushed`);
        # by default it waits for the leader's log end and the followers' flushed ends
        self.leader_flush_first = leader_flush_first
        self.broker_id = broker_id
        self.replicas = replicas
        self.flusher = flusher
        self.min_insync = min_insync
        self.role = Role.NONE
        self.state = PartitionState(-1, -1, [])
        self.zk_version = -1
        self.fenced = False  # ZooKeeper session lost: no produce until the state is read again
        self.followers: dict[int, FollowerPosition] = {}
        self._committers: list[Committer] = []  # acks=-1 answers waiting for the high watermark
        self._waiters: set[asyncio.Event] = set()  # long-polling followers' fetches, woken by appends
        self.isr_change_pending = False
        # A follower being added to the ISR: it counts for the HW from the moment the
        # expansion is written (Kafka's "maximal ISR"), because once ZooKeeper holds the
        # larger ISR the controller may make it leader — an acks=-1 answer given before
        # the write's result is applied here must not rest on the smaller ISR.
        self.joining: int | None = None
        # The ISR a shrink is writing: acks=-1 is refused against it from the moment the
        # write starts, because once ZooKeeper holds the smaller ISR a client may rightly
        # expect NotEnoughReplicas — an append accepted against the larger ISR meanwhile
        # could only end in NotEnoughReplicasAfterAppend or a timeout.
        self.shrinking: list[int] | None = None
        flusher.on_flushed = lambda flushed: self.update_high_watermark()

    @property
    def name(self) -> str:
        return self.log.name

    @property
    def epoch(self) -> int:
        return self.state.leader_epoch

    @property
    def isr(self) -> list[int]:
        return self.state.isr

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark or 0

    @property
    def is_leader(self) -> bool:
        return self.role is _LEADER

    # ------------------------------------------------------------------ role changes

    def become_leader(self, state: PartitionState, version: int) -> None:
        """Lead epoch `state.leader_epoch`: record where the epoch starts in the log, and
        assume every in-sync follower has at least the high watermark until it fetches."""
        now = time.monotonic()
        self.role, self.state, self.zk_version, self.fenced = Role.LEADER, state, version, False
        self.log.visible_unflushed = not self.leader_flush_first
        self.log.epochs.assign(state.leader_epoch, self.log.end_offset)
        self._fail_committers_truncated()
        hw = self.high_watermark
        self.followers = {
            r: FollowerPosition(hw if r in state.isr else -1, hw if r in state.isr else -1, now, now)
            for r in self.replicas if r != self.broker_id
        }
        logger.info("%s: leader in epoch %d, isr %s, log end %d, high watermark %d",
                    self.name, state.leader_epoch, state.isr, self.log.end_offset, hw)
        self.update_high_watermark()

    def become_follower(self, state: PartitionState, version: int) -> None:
        was_leader = self.is_leader
        self.role = Role.FOLLOWER if state.leader >= 0 else Role.NONE
        self.state, self.zk_version, self.fenced = state, version, False
        self.followers = {}
        self.log.visible_unflushed = False  # a follower shows what the leader's HW and its own disk both cover
        self.fail_committers(NotLeaderForPartition(
            f"broker {self.broker_id} is no longer the leader of {self.name} (now broker {state.leader}, "
            f"epoch {state.leader_epoch}); the messages may or may not be committed"))
        logger.info("%s: %s of broker %d in epoch %d (was %s), log end %d",
                    self.name, "follower" if state.leader >= 0 else "offline, no leader", state.leader,
                    state.leader_epoch, "leader" if was_leader else "not leader", self.log.end_offset)

    def update_isr(self, state: PartitionState, version: int) -> None:
        """Same leader and epoch, another ISR (written by us or by the controller)."""
        if state.isr != self.state.isr:
            logger.info("%s: isr %s -> %s (epoch %d)", self.name, self.state.isr, state.isr, state.leader_epoch)
        self.state, self.zk_version = state, version
        if self.is_leader:
            if len(state.isr) < self.min_insync:
                self.fail_committers(self._too_few_after_append())
            self.update_high_watermark()
            if self._committers and self._own_term_flushed():  # the leader alone now: its flush decides
                self.flusher.flush_to(max(c.offset for c in self._committers))

    def _too_few_after_append(self) -> NotEnoughReplicasAfterAppend:
        return NotEnoughReplicasAfterAppend(
            f"the isr of {self.name} shrank to {self.isr}, below min.insync.replicas={self.min_insync}, before the "
            "messages were replicated; a retry may duplicate them")

    # --------------------------------------------------------------- leader's book-keeping

    def appended(self) -> None:
        for waiter in self._waiters:
            waiter.set()
        self._waiters.clear()

    def record_fetch(self, replica_id: int, fetch_offset: int, flushed_offset: int) -> bool:
        """A follower fetched from `fetch_offset` (its log end), with `flushed_offset` on
        its disk. True when it is out of the ISR and has caught up — it has at least what
        the leader had when it answered its previous fetch, and the high watermark on
        disk: it should join."""
        position = self.followers.setdefault(replica_id, FollowerPosition())
        now = time.monotonic()
        end = self.log.end_offset
        caught_up = fetch_offset >= end or fetch_offset >= position.end_at_last_fetch >= 0
        if fetch_offset >= end:
            position.caught_up_at = now
        elif caught_up:  # it has what the leader had when it answered the previous fetch
            position.caught_up_at = max(position.caught_up_at, position.last_fetch_at)
        position.fetch_offset = fetch_offset
        position.flushed_offset = min(flushed_offset, fetch_offset)
        position.last_fetch_at, position.end_at_last_fetch = now, end
        self.update_high_watermark()
        # joining needs everything committed on its disk, so that the ISR never holds a
        # replica that would lose acknowledged messages in a crash
        return replica_id not in self.isr and caught_up and position.flushed_offset >= self.high_watermark

    def lagging(self, lag_seconds: float) -> list[int]:
        """ISR members that have not caught up with the leader within the lag time."""
        now = time.monotonic()
        return [r for r in self.isr if r != self.broker_id
                and now - self.followers.setdefault(r, FollowerPosition(caught_up_at=now)).caught_up_at > lag_seconds]

    def _own_term_flushed(self) -> bool:
        """Whether the leader's flushed end (not its log end) bounds the HW: under
        `all-flushed`, and whenever no follower is in the ISR — an acknowledged write
        is then on at least one disk, never only in one broker's memory."""
        return self.leader_flush_first or all(r == self.broker_id for r in self.isr) and self.joining is None

    def update_high_watermark(self) -> None:
        """HW = min over the ISR of the followers' flushed ends and the leader's log end
        (its flushed end under `all-flushed` or with no follower in the ISR); never
        back (docs/replication.md, "Visibility")."""
        if not self.is_leader:
            return
        members = self.isr if self.joining is None or self.joining in self.isr else [*self.isr, self.joining]
        own = self.log.flushed_offset if self._own_term_flushed() else self.log.end_offset
        ends = [own] + [
            self.followers[r].flushed_offset if r in self.followers else -1 for r in members if r != self.broker_id
        ]
        hw = min(ends)
        if hw <= self.high_watermark:
            return
        self.log.high_watermark = hw
        self.flusher.signal_advanced()  # long-polling consumers
        still = []
        for committer in self._committers:
            if committer.offset <= hw:
                if not committer.future.done():
                    committer.future.set_result(hw)
            else:
                still.append(committer)
        self._committers = still

    async def wait_committed(self, offset: int, epoch: int, timeout_ms: int) -> None:
        """acks=-1: return once the high watermark reaches `offset` (every ISR member has
        flushed the messages) while this broker still holds the bytes it appended as
        leader of `epoch`; RequestTimedOut after `timeout_ms`; NotEnoughReplicasAfterAppend
        if the ISR is below min.insync.replicas by then. NotLeaderForPartition at once if
        it no longer leads or lost those bytes — also when leadership moved away and back
        between the append and this call (docs/replication.md)."""
        if not self.holds_appended(epoch, offset):
            raise self._not_appended_here(epoch, offset)
        if len(self.isr) < self.min_insync:
            raise self._too_few_after_append()
        if self.high_watermark >= offset:
            return
        future = asyncio.get_running_loop().create_future()
        self._committers.append(Committer(offset, epoch, future))
        if self._own_term_flushed():
            self.flusher.flush_to(offset)  # the leader's own flushed end counts too
        try:
            await asyncio.wait_for(future, timeout_ms / 1000 if timeout_ms > 0 else None)
        except asyncio.TimeoutError:
            raise RequestTimedOut(
                f"messages up to offset {offset} of {self.name} were appended but not replicated to the isr "
                f"{self.isr} within {timeout_ms} ms (high watermark {self.high_watermark}); they may still be "
                "committed, a retry may duplicate them") from None

    def fail_committers(self, error: LogbusError) -> None:
        for committer in self._committers:
            if not committer.future.done():
                committer.future.set_exception(error)
        self._committers = []

    def holds_appended(self, epoch: int, offset: int) -> bool:
        """Whether this broker leads and its log still holds what it appended as leader
        of `epoch` up to `offset`: the same epoch, or a later one whose epoch cache says
        `epoch` still reaches `offset` (KIP-101's test — a broker that followed in
        between may have truncated those bytes and appended others at their offsets)."""
        if not self.is_leader:
            return False
        if epoch == self.epoch:
            return True
        found, end = self.log.epochs.end_offset_for(epoch, self.log.end_offset)
        return found == epoch and end >= offset

    def _fail_committers_truncated(self) -> None:
        """A new epoch: waiters of an earlier one stay only while their bytes do."""
        kept = []
        for committer in self._committers:
            if self.holds_appended(committer.epoch, committer.offset):
                kept.append(committer)
            elif not committer.future.done():
                committer.future.set_exception(self._not_appended_here(committer.epoch, committer.offset))
        self._committers = kept

    def _not_appended_here(self, epoch: int, offset: int) -> NotLeaderForPartition:
        leading = f"leads in epoch {self.epoch}" if self.is_leader else f"no longer leads (leader {self.state.leader})"
        return NotLeaderForPartition(
            f"broker {self.broker_id} {leading} {self.name}; the messages up to offset {offset} appended in epoch "
            f"{epoch} may or may not be committed")


async def wait_for_any_append(partitions: list[Partition], timeout: float) -> None:
    """A follower's long poll over every partition it fetches from this leader: return
    once any of them is appended to, or after `timeout`. One event for all of them."""
    appended = asyncio.Event()
    for part in partitions:
        part._waiters.add(appended)
    try:
        await asyncio.wait_for(appended.wait(), timeout)
    except asyncio.TimeoutError:
        pass
    finally:
        for part in partitions:
            part._waiters.discard(appended)
