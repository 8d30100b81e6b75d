"""The controller: one broker, elected through the ephemeral `/controller` node, that
moves partition leadership when brokers come and go (docs/replication.md).

Every broker runs a `Controller`; the one whose create of `/controller` succeeds is
active, bumps `/controller_epoch` (compare-and-set) and, on every change of
`/brokers/ids` or `/brokers/topics` (and every `recheck_interval` as a safety net),
re-decides every partition with a state node (`broker.server.election.elect`). It only writes
state nodes, each with compare-and-set on the node's version inside a transaction that
also checks `/controller_epoch` is still ours, so a deposed controller cannot write;
brokers learn their roles by watching those nodes. A lost CAS re-reads and re-decides.

When the active controller's session expires its node goes away; every broker's watch
on `/controller` fires and the first to create it takes over and re-reads everything.
Work runs in the controller's own thread, never in kazoo's event thread.

Only a registered broker runs for controller, and `/controller` counts only as the
ephemeral node of the registered session of the broker it names: a node anyone else
left there (persistent, another session's, unreadable) is logged and deleted, and the
election goes on (`broker.server.controllernode`), so it cannot leave the cluster without a
controller. A controller whose node is replaced steps down and runs again.

A controller that has just taken over cannot tell a live broker's registration from a
dead one's that ZooKeeper has not expired yet: for twice the session timeout it does not
move a restarted leader's partition onto a broker registered before the takeover
(`TakeoverGrace`, docs/controller.md "Lingering sessions").
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from broker.common.zklayout import (
    BROKER_IDS, BROKER_TOPICS, CONTROLLER, CONTROLLER_EPOCH, DELETE_TOPICS, PartitionState, broker_path, decode_controller,
    partition_state_path, read_assignment, read_partition_state,
)
from broker.server.controllernode import Deposed, bump_controller_epoch, claim_controller_node, owns
from broker.server.election import OFFLINE, bounced, elect, imbalanced, prefer, registered_after
from broker.server.topicdeleter import TopicDeleter

logger = logging.getLogger(__name__)

CAS_ATTEMPTS = 20


def read_controller(zk: KazooClient) -> int | None:
    """The active controller's broker id, or None while there is none."""
    try:
        data, _ = zk.get(CONTROLLER)
    except NoNodeError:
        return None
    return decode_controller(data)


class TakeoverGrace:
    """The time after a takeover in which a registration older than it may be a dead
    broker's session ZooKeeper has not expired yet. Say every broker was killed and the
    old leader came back first and became the controller: handed to a dead broker, the
    leadership would leave the restarted leader out of the ISR, and once the dead
    sessions expire the partition would be offline with an ISR of brokers that are down
    (docs/controller.md, "Lingering sessions")."""

    def __init__(self, session_timeout: float, controller: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._controller = controller  # registered before the takeover too, but its session is ours: live
        # a session's expiry may come a tick after its timeout, and ZooKeeper may negotiate
        # a longer timeout than asked: twice the setting covers both for ticks up to it
        self.linger = 2 * session_timeout
        self._zxid = 0  # czxid of our /controller node
        self._at = 0.0  # clock() at the takeover
        self._deferred: set[tuple[str, int]] = set()  # partitions waiting out lingering sessions

    def begin(self, controller_czxid: int) -> None:
        self._zxid, self._at, self._deferred = controller_czxid, self._clock(), set()

    def may_be_lingering(self, live: dict[int, int], broker: int) -> bool:
        """Whether `broker`'s registration predates the takeover, which is too recent
        for a dead broker's session to be gone. Never the controller's own."""
        return broker != self._controller and live[broker] < self._zxid and self._clock() < self._at + self.linger

    def defer(self, topic: str, partition: int, leader: int, successor: int) -> None:
        if (topic, partition) not in self._deferred:
            self._deferred.add((topic, partition))
            logger.info("controller: %s-%d: leader %d restarted; broker %d's registration predates this takeover and "
                        "may be a dead broker's lingering session: deciding once %.1fs have passed since the takeover",
                        topic, partition, leader, successor, self.linger)

    def decided(self, topic: str, partition: int) -> None:
        self._deferred.discard((topic, partition))

    def until_over(self) -> float | None:
        """Seconds until the deferred partitions may be decided; None with none deferred
        or the grace over (a deferred partition's topic may be gone: no wake is owed)."""
        left = self._at + self.linger - self._clock()
        return left if self._deferred and left > 0 else None


class Controller:
    def __init__(self, zk: KazooClient, broker_id: int, unclean_election: bool, rebalance_interval: float | None = None,
                 recheck_interval: float = 5.0, imbalance_percentage: int = 10, session_timeout: float = 6.0) -> None:
        self.zk = zk
        self.broker_id = broker_id
        self.unclean_election = unclean_election
        self.rebalance_interval = rebalance_interval  # seconds between preferred-leader checks; None: never
        self.recheck_interval = recheck_interval
        self.imbalance_percentage = imbalance_percentage  # leader.imbalance.per.broker.percentage
        self._next_rebalance = 0.0
        self.active = False
        self.epoch = 0
        self._epoch_version = -1  # zk version of /controller_epoch when we bumped it
        self._live: dict[int, int] = {}  # broker id -> czxid of its registration, at the last pass
        self.grace = TakeoverGrace(session_timeout, broker_id)
        self.deleter = TopicDeleter(zk)  # topics marked for deletion (broker.server.topicdeleter)
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="logbus-controller", daemon=True)

    def start(self) -> None:
        self.zk.add_listener(self._on_session)
        DataWatch(self.zk, CONTROLLER, self._on_controller_node)
        ChildrenWatch(self.zk, BROKER_IDS, self._on_change)
        ChildrenWatch(self.zk, BROKER_TOPICS, self._on_change)
        ChildrenWatch(self.zk, DELETE_TOPICS, self._on_change)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    # ------------------------------------------------------------ kazoo callbacks

    def _on_session(self, state: str) -> None:
        if state == KazooState.LOST and self.active:
            self.active = False
            logger.warning("broker %d: ZooKeeper session lost; no longer the controller (epoch %d)",
                           self.broker_id, self.epoch)
        self._wake.set()

    def _on_controller_node(self, data: bytes | None, stat: object) -> bool | None:
        if self._stopping:
            return False
        self._wake.set()  # gone (run for controller), or replaced (is it still ours, or a live broker's?)
        return None

    def _on_change(self, children: list[str]) -> bool | None:
        if self._stopping:
            return False
        self._wake.set()
        return None

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._until_next_check())
            self._wake.clear()
            if self._stopping:
                return
            try:
                if self.active and not owns(self.zk, CONTROLLER):
                    self.active = False
                    logger.warning("broker %d: /controller is no longer ours; stepping down", self.broker_id)
                if not self.active:
                    self._try_to_become_controller()
                if self.active:
                    self.deleter.delete_marked(self._epoch_version)
                    self._pass()
                    if self.rebalance_interval is not None and time.monotonic() >= self._next_rebalance:
                        self._rebalance()
            except Deposed:
                self.active = False
                logger.warning("broker %d: another controller took over; stepping down", self.broker_id)
            except Exception as exc:  # ZooKeeper unreachable and the like: retry on the next wake
                logger.warning("controller pass on broker %d failed (%s); retrying", self.broker_id, exc)
                self._wake.set()
                time.sleep(0.5)

    def _until_next_check(self) -> float:
        if not self.active:
            return self.recheck_interval
        now = time.monotonic()
        wait = self.recheck_interval
        if self.rebalance_interval is not None:
            wait = min(wait, self._next_rebalance - now)
        if (grace := self.grace.until_over()) is not None:
            wait = min(wait, grace)
        return max(0.0, wait)

    def _try_to_become_controller(self) -> None:
        if not owns(self.zk, broker_path(self.broker_id)):
            return  # unregistered: brokers trust only a registered broker's /controller; registering wakes us
        stat = claim_controller_node(self.zk, self.broker_id)
        if stat is None:
            return
        self.grace.begin(stat.czxid)
        self.epoch, self._epoch_version = bump_controller_epoch(self.zk)
        self._live = self._live_brokers()
        self._next_rebalance = time.monotonic() + (self.rebalance_interval or 0)
        self.active = True
        logger.info("broker %d is the controller (controller epoch %d); live brokers %s",
                    self.broker_id, self.epoch, sorted(self._live))

    def _live_brokers(self) -> dict[int, int]:
        live = {}
        for child in self.zk.get_children(BROKER_IDS):
            stat = self.zk.exists(broker_path(int(child)))
            if stat is not None:
                live[int(child)] = stat.czxid
        return live

    # ---------------------------------------------------------------- decisions

    def _pass(self) -> None:
        """Re-decide every partition against the live brokers."""
        live = self._live_brokers()
        back = bounced(self._live, live)
        for gone in sorted(set(self._live) - set(live)):
            logger.info("controller: broker %d is gone", gone)
        for new in sorted(set(live) - set(self._live)):
            logger.info("controller: broker %d is live", new)
        if back:
            logger.info("controller: brokers %s re-registered (restarted or new session); moving their leaderships",
                        sorted(back))
        self._decide_all(live, back)
        self._live = live

    def _decide_all(self, live: dict[int, int], back: set[int]) -> None:
        for topic in self.zk.get_children(BROKER_TOPICS):
            assignment = read_assignment(self.zk, topic) or {}
            for partition, replicas in sorted(assignment.items()):
                self._decide(topic, partition, replicas, live, back)

    def _decide(self, topic: str, partition: int, replicas: list[int], live: dict[int, int], back: set[int]) -> None:
        """Decide one partition. A broker that re-registered since the last pass (`back`)
        or since the state node was last written is first treated as dead — it loses a
        leadership it may no longer be fit for (a restarted leader may have lost its
        tail: KIP-101) and leaves the ISR — then, once that is written, as live. The
        broker itself refuses to lead such a node (`ReplicaManager.apply_state`), so
        the two rules meet: a partition is never left waiting on the other."""
        for _ in range(CAS_ATTEMPTS):
            node = read_partition_state(self.zk, topic, partition)
            if node is None or node.version == -1:
                return  # gone, or a topic from before replication (no state node): nothing to move
            named = {node.state.leader, *node.state.isr}  # what the node may wrongly credit them with
            unfit = (back | registered_after(live, node.mzxid)) & live.keys() & named
            election = elect(node.state, replicas, live.keys() - unfit, self.unclean_election, self.epoch)
            if election is None and unfit:  # nothing to take from them: decide with everyone live
                election = elect(node.state, replicas, set(live), self.unclean_election, self.epoch)
            if election is None:
                return
            successor = election.state.leader
            if node.state.leader in unfit and successor not in (OFFLINE, node.state.leader) \
                    and self.grace.may_be_lingering(live, successor):
                self.grace.defer(topic, partition, node.state.leader, successor)
                return
            self.grace.decided(topic, partition)
            if self._write(topic, partition, election.state, node.version):
                log_decision(topic, partition, node.state, election.state, election.unclean)
                back = set()  # the node now postdates every registration we saw: decide again with all live
                continue
            logger.info("controller: state of %s-%d changed while deciding; reading it again", topic, partition)
        logger.warning("controller: gave up on %s-%d after %d concurrent updates; next pass retries",
                       topic, partition, CAS_ATTEMPTS)

    def _rebalance(self) -> None:
        """auto.leader.rebalance.enable: hand each leadership back to its preferred
        replica when that one is live, in the ISR and registered before the state node's
        last write (`election.prefer`) — for the brokers whose imbalance is above
        `leader.imbalance.per.broker.percentage` (`election.imbalanced`). A lost
        compare-and-set waits for the next check."""
        self._next_rebalance = time.monotonic() + self.rebalance_interval
        live = self._live_brokers()
        partitions = []
        for topic in self.zk.get_children(BROKER_TOPICS):
            for partition, replicas in sorted((read_assignment(self.zk, topic) or {}).items()):
                node = read_partition_state(self.zk, topic, partition)
                if node is not None and node.version != -1 and len(replicas) > 1:
                    partitions.append((topic, partition, replicas, node))
        over = imbalanced([(replicas[0], node.state.leader) for _, _, replicas, node in partitions],
                          self.imbalance_percentage)
        for topic, partition, replicas, node in partitions:
            if replicas[0] not in over:
                continue
            fit = live.keys() - registered_after(live, node.mzxid)
            election = prefer(node.state, replicas, fit, self.epoch)
            if election is not None and self._write(topic, partition, election.state, node.version):
                logger.info("controller: %s-%d leader %d -> %d, its preferred replica, epoch %d (leader rebalance)",
                            topic, partition, node.state.leader, election.state.leader,
                            election.state.leader_epoch)

    def _write(self, topic: str, partition: int, state: PartitionState, version: int) -> bool:
        """CAS the state node, only while /controller_epoch is still the one we set."""
        transaction = self.zk.transaction()
        transaction.check(CONTROLLER_EPOCH, self._epoch_version)
        transaction.set_data(partition_state_path(topic, partition), state.encode(), version)
        epoch_check, state_set = transaction.commit()
        if isinstance(epoch_check, BadVersionError) or isinstance(epoch_check, NoNodeError):
            raise Deposed()
        if isinstance(state_set, Exception):
            if isinstance(state_set, (BadVersionError, NoNodeError)):
                return False
            raise state_set
        return True


def log_decision(topic: str, partition: int, old: PartitionState, new: PartitionState, unclean: bool) -> None:
    """One line per state the controller wrote: operators grep for UNCLEAN and OFFLINE."""
    where = f"{topic}-{partition}"
    if unclean:
        logger.warning(
            "controller: UNCLEAN election of %s: broker %d (not in the ISR %s) leads epoch %d; messages "
            "acknowledged by the old ISR but missing on broker %d are lost", where, new.leader, old.isr,
            new.leader_epoch, new.leader)
    elif new.leader == OFFLINE:
        logger.warning("controller: %s is OFFLINE (epoch %d): no live ISR member of %s "
                       "(unclean.leader.election.enable is off)", where, new.leader_epoch, old.isr)
    elif new.leader != old.leader:
        logger.info("controller: %s leader %d -> %d, epoch %d, isr %s", where, old.leader, new.leader,
                    new.leader_epoch, new.isr)
    else:
        logger.info("controller: %s isr %s -> %s (dead brokers removed), leader %d epoch %d", where, old.isr,
                    new.isr, new.leader, new.leader_epoch)
