"""Who leads a partition: the controller's decisions as pure functions (no ZooKeeper),
so every case — clean, unclean, offline, a broker that bounced — is unit-tested.

The rules (docs/replication.md, "The controller"):
- a live leader keeps leading; dead brokers leave its ISR (a broker that comes back
  rejoins as a follower and the leader re-admits it once caught up);
- a dead (or bounced: re-registered since the last pass, or since the state node was
  last written) leader is replaced by the first live ISR member in replica-list
  order (the preferred order), with leader_epoch + 1 and the ISR cut to its live members;
- with no live ISR member the partition goes offline (leader = -1, epoch + 1) and
  keeps its last ISR, so that the first of those brokers to return leads again;
- a partition with a single replica keeps its state: there is no one else to lead;
- only with `unclean.leader.election.enable` may a live replica outside the ISR lead
  (ISR = [it]): messages only the old ISR had are lost;
- with `auto.leader.rebalance.enable`, every `leader.imbalance.check.interval.seconds`
  a live, in-sync preferred replica takes its leadership back (`prefer`) — for the
  brokers whose share of preferred partitions led by another exceeds
  `leader.imbalance.per.broker.percentage` (`imbalanced`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import NamedTuple

from broker.common.zklayout import PartitionState

OFFLINE = -1


class Election(NamedTuple):
    """A new state for a partition and whether it was an unclean choice."""

    state: PartitionState
    unclean: bool = False


def elect(state: PartitionState, replicas: list[int], live: set[int], unclean_allowed: bool,
          controller_epoch: int) -> Election | None:
    """The partition's next state given the live brokers, or None if it stays as it is.

    `live` excludes brokers that bounced (re-registered with a new session) since the
    controller last looked: a restarted leader must not keep leading an epoch whose
    tail it may have lost (KIP-101), so it is treated as dead for this decision.

    A single-replica partition is never touched: its one broker leads whenever it is
    live (clients see leader -1 while it is not), exactly as before replication."""
    if len(replicas) == 1:
        return None
    if state.leader != OFFLINE and state.leader in live:
        isr = [b for b in state.isr if b in live]
        if isr == list(state.isr):
            return None
        return Election(dataclasses.replace(state, isr=isr, controller_epoch=controller_epoch))
    candidates = [b for b in replicas if b in state.isr and b in live]
    if candidates:
        leader = candidates[0]
        isr = [b for b in state.isr if b in live]
        return Election(_lead(state, leader, isr, controller_epoch))
    if unclean_allowed:
        out_of_sync = [b for b in replicas if b in live]
        if out_of_sync:
            return Election(_lead(state, out_of_sync[0], [out_of_sync[0]], controller_epoch), unclean=True)
    if state.leader == OFFLINE:
        return None
    return Election(_lead(state, OFFLINE, list(state.isr), controller_epoch))


def prefer(state: PartitionState, replicas: list[int], live: set[int], controller_epoch: int) -> Election | None:
    """Give leadership back to the preferred replica (the first of the replica list) if
    another replica leads and the preferred one is live and in the ISR — the state
    failovers leave behind, with a few brokers leading everything. Being in the ISR,
    it has every committed message; the old leader follows it and truncates by epoch.
    None if the partition is balanced, offline or single-replica."""
    preferred = replicas[0]
    if len(replicas) == 1 or state.leader in (OFFLINE, preferred):
        return None
    if preferred not in live or preferred not in state.isr:
        return None
    return Election(_lead(state, preferred, list(state.isr), controller_epoch))


def imbalanced(preferred_and_leader: list[tuple[int, int]], percentage: int) -> set[int]:
    """Kafka's `leader.imbalance.per.broker.percentage`: from (preferred replica, leader)
    of every replicated partition, the brokers for which more than `percentage`% of the
    partitions they are preferred for are led by another broker. Only those get their
    leaderships back: a leader move costs producers a retry and a follower a truncation,
    so a slight imbalance is left alone."""
    preferred = Counter(broker for broker, _ in preferred_and_leader)
    elsewhere = Counter(broker for broker, leader in preferred_and_leader if leader != broker)
    return {b for b, n in elsewhere.items() if n * 100 > percentage * preferred[b]}


def _lead(state: PartitionState, leader: int, isr: list[int], controller_epoch: int) -> PartitionState:
    return dataclasses.replace(state, leader=leader, leader_epoch=state.leader_epoch + 1, isr=isr,
                               controller_epoch=controller_epoch)


def registered_after(registrations: dict[int, int], written_zxid: int) -> set[int]:
    """Brokers ({broker id: registration czxid}) registered after a state node's last
    write (its mzxid): whatever the node says of them predates their restart or new
    session. Unlike `bounced`, this needs no earlier snapshot, so it holds for a
    controller that has just taken over."""
    return {b for b, created in registrations.items() if created > written_zxid}


def bounced(before: dict[int, int], now: dict[int, int]) -> set[int]:
    """Brokers registered in both snapshots ({broker id: registration czxid}) but by a
    different session: they restarted (or lost their session) in between."""
    return {b for b, created in now.items() if b in before and before[b] != created}
