"""One Kafka consumer group as its coordinator holds it (the classic protocol, Kafka's
`GroupMetadata`): members, generation, the protocol they agreed on and the state the
group is in. Pure: no I/O and no clock of its own (times are passed in), so every
transition is decided here and the coordinator (`broker.server.kafka.coordinator`) only
waits, persists and answers.

States: Empty (no members; offsets may be committed with generation -1),
PreparingRebalance (members rejoin until all have or the rebalance timeout passes),
CompletingRebalance (a new generation; the leader's assignment is awaited), Stable
(every member has its assignment), Dead (never held: an unknown group describes so).
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode


class GroupState(str, enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True)
class JoinAnswer:
    """What a JoinGroup gets back."""

    error: ErrorCode
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    members: tuple[tuple[str, bytes], ...] = ()  # the leader's: (member id, metadata)


@dataclass(frozen=True)
class SyncAnswer:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol: str | None = None


@dataclass
class Member:
    member_id: str
    client_host: str
    session_timeout: float  # seconds
    rebalance_timeout: float
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata), in the member's order of preference
    last_heard: float
    assignment: bytes = b""
    joining: asyncio.Future | None = field(default=None, repr=False)  # a JoinGroup awaiting the new generation
    syncing: asyncio.Future | None = field(default=None, repr=False)  # a SyncGroup awaiting the assignment

    def metadata(self, protocol: str) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")

    def expired(self, now: float) -> bool:
        """A member with a request waiting is alive; otherwise its heartbeats keep it."""
        return self.joining is None and self.syncing is None and now > self.last_heard + self.session_timeout

    def answer_join(self, answer: JoinAnswer, now: float) -> None:
        if self.joining is not None and not self.joining.done():
            self.joining.set_result(answer)
        self.joining = None
        self.last_heard = now

    def answer_sync(self, answer: SyncAnswer, now: float) -> None:
        if self.syncing is not None and not self.syncing.done():
            self.syncing.set_result(answer)
        self.syncing = None
        self.last_heard = now


class Group:
    def __init__(self, group_id: str, generation: int = 0, protocol_type: str = "") -> None:
        self.group_id = group_id
        self.generation = generation  # the last one, persisted; the next rebalance makes generation + 1
        self.protocol_type = protocol_type
        self.protocol: str | None = None
        self.leader: str | None = None
        self.state = GroupState.EMPTY
        self.members: dict[str, Member] = {}
        self.pending: dict[str, float] = {}  # member ids handed out by MEMBER_ID_REQUIRED -> when they lapse
        self.rebalance_deadline = 0.0  # PreparingRebalance ends by then, whoever has not rejoined
        self.initial_until = 0.0  # a rebalance from Empty waits this long for more members
        self.completing = False  # a new generation is being persisted

    # ------------------------------------------------------------ questions

    def accepts(self, protocol_type: str, protocols: tuple[tuple[str, bytes], ...], member_id: str = "") -> bool:
        """Whether a member with these protocols may join: the group's protocol type, and
        a protocol every other member supports too (INCONSISTENT_GROUP_PROTOCOL else)."""
        if not protocols or not protocol_type:
            return False
        others = [m for m in self.members.values() if m.member_id != member_id]
        if not others:
            return True
        if protocol_type != self.protocol_type:
            return False
        return bool(self.common_protocols(others) & {name for name, _ in protocols})

    @staticmethod
    def common_protocols(members: list[Member]) -> set[str]:
        common = {name for name, _ in members[0].protocols}
        for member in members[1:]:
            common &= {name for name, _ in member.protocols}
        return common

    def select_protocol(self) -> str:
        """Kafka's rule: each member votes for its most preferred protocol of those all
        members support; the most votes win (ties: the first voted for)."""
        members = list(self.members.values())
        common = self.common_protocols(members)
        votes = Counter(next(name for name, _ in m.protocols if name in common) for m in members)
        return votes.most_common(1)[0][0]

    def all_rejoined(self) -> bool:
        return not self.pending and all(m.joining is not None for m in self.members.values())

    def commit_error(self, generation: int, member_id: str, now: float) -> ErrorCode:
        """Whether this member may commit now (Kafka's rules): generation -1 only to a
        group without members ("simple" consumers, tools); otherwise a member of the
        current generation — one of an earlier generation (a zombie the group moved on
        from) cannot move offsets."""
        if generation < 0 and not self.members:
            return ErrorCode.none
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if generation != self.generation:
            return ErrorCode.illegal_generation
        if self.state == GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        member.last_heard = now
        return ErrorCode.none

    def max_rebalance_timeout(self) -> float:
        return max((m.rebalance_timeout for m in self.members.values()), default=0.0)

    # ---------------------------------------------------------- transitions

    def prepare_rebalance(self, now: float, initial_delay: float) -> None:
        """Into PreparingRebalance: waiting syncs are told to rejoin."""
        if self.state == GroupState.PREPARING_REBALANCE:
            return
        for member in self.members.values():
            member.answer_sync(SyncAnswer(ErrorCode.rebalance_in_progress), now)
        timeout = self.max_rebalance_timeout()
        self.initial_until = now + min(initial_delay, timeout) if self.state == GroupState.EMPTY else 0.0
        self.rebalance_deadline = now + timeout
        self.state = GroupState.PREPARING_REBALANCE

    def remove(self, member_id: str, now: float, initial_delay: float) -> None:
        """A member leaves or expires: its waiting requests are refused; the others rebalance."""
        member = self.members.pop(member_id)
        member.answer_join(JoinAnswer(ErrorCode.unknown_member_id, member_id), now)
        member.answer_sync(SyncAnswer(ErrorCode.unknown_member_id), now)
        if self.leader == member_id:
            self.leader = next(iter(self.members), None)
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self.prepare_rebalance(now, initial_delay)

    def may_complete_join(self, now: float) -> bool:
        return (self.state == GroupState.PREPARING_REBALANCE and not self.completing
                and (self.all_rejoined() and now >= self.initial_until or now >= self.rebalance_deadline))

    def drop_absent(self, now: float, initial_delay: float) -> None:
        """At the end of a rebalance, members that did not rejoin are out."""
        for member_id in [m.member_id for m in self.members.values() if m.joining is None]:
            self.remove(member_id, now, initial_delay)
        self.pending.clear()

    def new_generation(self, generation: int, now: float) -> None:
        """Into CompletingRebalance (Empty without members) at `generation`: every
        waiting join is answered; the leader gets the members' metadata."""
        self.generation = generation
        if not self.members:
            self.state, self.protocol, self.leader = GroupState.EMPTY, None, None
            return
        self.protocol = self.select_protocol()
        if self.leader not in self.members:
            self.leader = next(iter(self.members))
        self.state = GroupState.COMPLETING_REBALANCE
        metadata = tuple((m.member_id, m.metadata(self.protocol)) for m in self.members.values())
        for member in self.members.values():
            member.assignment = b""
            member.answer_join(self.join_answer(member.member_id, metadata if member.member_id == self.leader
                                                else ()), now)

    def join_answer(self, member_id: str, members: tuple[tuple[str, bytes], ...] = ()) -> JoinAnswer:
        return JoinAnswer(ErrorCode.none, member_id, self.generation, self.protocol_type, self.protocol,
                          self.leader or "", members)

    def assign(self, assignments: dict[str, bytes], now: float) -> None:
        """The leader's SyncGroup: every member's assignment (none: empty), Stable."""
        for member in self.members.values():
            member.assignment = assignments.get(member.member_id, b"")
            member.answer_sync(self.sync_answer(member), now)
        self.state = GroupState.STABLE

    def sync_answer(self, member: Member) -> SyncAnswer:
        return SyncAnswer(ErrorCode.none, member.assignment, self.protocol_type, self.protocol)

    def abandon(self, error: ErrorCode, now: float) -> None:
        """The coordinator lost the role: every waiting request gets `error`."""
        for member in self.members.values():
            member.answer_join(JoinAnswer(error, member.member_id), now)
            member.answer_sync(SyncAnswer(error), now)
