"""The broker's replicas: which replicated partitions it leads or follows, learnt from
the partition state nodes in ZooKeeper (the controller writes them; this broker writes
only ISR changes of partitions it leads: `isr.py`), and what request handlers ask of
them. The replication requests (REPLICA_FETCH, LEADER_EPOCH_END) are answered by
`sessions.py`. docs/replication.md.

Partitions with one replica never come here: they behave exactly as before replication.
kazoo calls back in its own threads; everything that touches a `Partition` is moved to
the event loop with `call_soon_threadsafe`, and ZooKeeper calls run in the executor.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from kazoo.client import KazooClient, KazooState
from kazoo.recipe.watchers import DataWatch

from broker.common.errors import NotEnoughReplicas, NotLeaderForPartition, PartitionOffline, UnknownTopic
from broker.common.protocol import Body, BrokerInfo, LeaderEpochEndRequest, ReplicaFetchRequest
from broker.common.zklayout import PartitionState, StateNode, partition_state_path, read_partition_state
from broker.server.auth.interbroker import InterBrokerSecurity
from broker.server.config import BrokerConfig
from broker.server.log.log import Log
from broker.server.log.manager import LogManager
from broker.server.log.scheduler import FlushScheduler
from broker.server.registration import BrokerRegistry
from broker.server.replication.fetcher import SourceFetcher
from broker.server.replication.isr import IsrChanges
from broker.server.replication.partition import Partition, Role
from broker.server.replication.sessions import FetchSessions

logger = logging.getLogger(__name__)

Key = tuple[str, int]


class ReplicaManager:
    def __init__(self, config: BrokerConfig, logs: LogManager, scheduler: FlushScheduler,
                 registry: BrokerRegistry, zk: KazooClient, security: InterBrokerSecurity) -> None:
        self.config = config
        self.security = security  # how followers reach leaders
        self.logs = logs
        self.scheduler = scheduler
        self.registry = registry
        self.zk = zk
        self.partitions: dict[Key, Partition] = {}
        self._fetchers: dict[int, SourceFetcher] = {}  # leader id -> what this broker follows there
        self._following: dict[Key, int] = {}  # followed partition -> its leader id
        self._watched: dict[Key, list[int]] = {}  # partition -> replicas, for every state node watched
        self._lock = threading.Lock()  # guards `_watched` (kazoo threads)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        self.isr = IsrChanges(config, registry, zk, self.apply_state)
        self.sessions = FetchSessions(config, self.partitions, self.isr)

    # ------------------------------------------------------------------ life cycle

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.zk.add_listener(self._on_zk_state)
        self.registry.on_registered = self._on_registered
        self._tasks = [
            asyncio.ensure_future(self._every(self.config.replica_lag_time_max_ms / 4000, self._shrink_isr)),
            asyncio.ensure_future(self._every(self.config.replica_high_watermark_checkpoint_interval_ms / 1000,
                                              self._checkpoint)),
        ]

    def stop(self) -> None:
        self.zk.remove_listener(self._on_zk_state)
        for task in self._tasks:
            task.cancel()
        for fetcher in self._fetchers.values():
            fetcher.stop()
        self._fetchers.clear()
        self._following.clear()

    async def _every(self, seconds: float, job) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await job()
            except Exception:
                logger.exception("replication job %s failed", job.__name__)

    async def _checkpoint(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.logs.checkpoint_high_watermarks)

    # -------------------------------------------------------- learning roles from ZooKeeper

    def on_assignment(self, topic: str, assignment: dict[int, list[int]]) -> None:
        """From the registry (kazoo thread): watch the state node of every replicated
        partition this broker is a replica of."""
        for partition, replicas in assignment.items():
            if len(replicas) < 2 or self.config.broker_id not in replicas:
                continue
            with self._lock:
                if (topic, partition) in self._watched:
                    continue
                self._watched[(topic, partition)] = replicas
            DataWatch(self.zk, partition_state_path(topic, partition), self._state_watcher(topic, partition, replicas))

    def forget_topic(self, topic: str) -> None:
        """Its topic deleted (kazoo thread): stop watching its state nodes, then, on the
        event loop, following and leading its partitions; acks=-1 waiters are told."""
        with self._lock:
            for key in [k for k in self._watched if k[0] == topic]:
                del self._watched[key]
        self._loop.call_soon_threadsafe(self._drop, topic)

    def _drop(self, topic: str) -> None:
        for key in [k for k in self.partitions if k[0] == topic]:
            self._stop_fetcher(key)
            self.partitions.pop(key).fail_committers(UnknownTopic(f"topic {topic!r} was deleted"))

    def _state_watcher(self, topic: str, partition: int, replicas: list[int]):
        # exactly two parameters: kazoo passes a third (the event) to callbacks that take one
        seen = []  # once a node was read, its absence is a deletion, not a topic from before replication

        def watch(data: bytes | None, stat) -> bool | None:
            if self._watched.get((topic, partition)) is not replicas or (data is None and seen):
                return False  # its topic was deleted (a new incarnation has a watch of its own)
            if data is None:  # created before replication: the first replica leads alone
                node = StateNode(PartitionState(replicas[0], 0, [replicas[0]]), -1)
            else:
                seen.append(True)
                try:
                    node = StateNode(PartitionState.decode(data), stat.version, stat.mzxid)
                except (ValueError, KeyError, TypeError):
                    logger.error("ignoring unreadable state of %s-%d: %r", topic, partition, data[:200])
                    return
            self._loop.call_soon_threadsafe(self.apply_state, topic, partition, replicas, node)

        return watch

    def apply_state(self, topic: str, partition: int, replicas: list[int], node: StateNode) -> None:
        """On the event loop: take the role the state node gives this broker — except
        leading an epoch named before this broker's registration: it restarted or lost
        its session since, may have lost that epoch's tail, and the controller treats
        it as unfit until it writes a new epoch (`Controller._decide`)."""
        state, version = node.state, node.version
        key = (topic, partition)
        part = self.partitions.get(key)
        if part is None:
            log = self.logs.get_or_create(topic, partition)
            self._start_high_watermark(log)
            part = self.partitions[key] = Partition(
                log, self.config.broker_id, replicas, self.scheduler.flusher(log), self.config.min_insync_replicas,
                leader_flush_first=self.config.replica_visibility == "all-flushed")
        if version != -1 and version < part.zk_version or state.leader_epoch < part.epoch:
            return  # an older read than the one applied
        me = self.config.broker_id
        if state.leader == me and not self._fit_to_lead(node):
            if part.is_leader:
                part.fenced = True
            logger.info("%s: the state naming this broker leader of epoch %d predates its registration; "
                        "waiting for the controller's next epoch", part.name, state.leader_epoch)
            return
        same_role = part.state.leader == state.leader and part.epoch == state.leader_epoch and part.role is not Role.NONE
        if same_role and not part.fenced:
            part.update_isr(state, version)
            return
        self._stop_fetcher(key)
        if state.leader == me:
            part.become_leader(state, version)
        else:
            part.become_follower(state, version)
            if state.leader >= 0:
                self._start_fetcher(key, part, state.leader)

    def _fit_to_lead(self, node: StateNode) -> bool:
        registered = self.registry.registered_zxid
        return node.version == -1 or (registered is not None and node.mzxid > registered)

    def _on_registered(self) -> None:
        """A state that came before our registration's zxid was known may have been
        refused: read them all again now that it is (in a thread: this runs inside a
        ZooKeeper call)."""
        if self._loop is not None:
            threading.Thread(target=self._reread_all, name="logbus-reread-state", daemon=True).start()

    def _start_high_watermark(self, log: Log) -> None:
        if log.high_watermark is None:
            log.high_watermark = min(self.logs.checkpointed_hw.get((log.topic, log.partition), 0), log.end_offset)

    def _start_fetcher(self, key: Key, part: Partition, leader_id: int) -> None:
        fetcher = self._fetchers.get(leader_id)
        if fetcher is None:
            fetcher = self._fetchers[leader_id] = SourceFetcher(leader_id, self.config, self.scheduler.executor,
                                                                self._broker, self.security)
        self._following[key] = leader_id
        fetcher.add(part)

    def _broker(self, broker_id: int) -> BrokerInfo | None:
        return self.registry.view.brokers.get(broker_id)  # the view is replaced whole: look it up each time

    def _stop_fetcher(self, key: Key) -> None:
        leader_id = self._following.pop(key, None)
        fetcher = self._fetchers.get(leader_id)
        if fetcher is not None:
            fetcher.remove(key)
            if fetcher.idle:
                del self._fetchers[leader_id]

    # ------------------------------------------------------------- ZooKeeper session loss

    def _on_zk_state(self, state: str) -> None:
        """A lost session may mean another broker leads now: stop acting as leader (no
        produce) until the state nodes are read again, once registered in the new
        session (`_on_registered`)."""
        if state == KazooState.LOST:
            self._loop.call_soon_threadsafe(self._fence_all)

    def _fence_all(self) -> None:
        for part in self.partitions.values():
            if part.is_leader and not part.fenced:
                part.fenced = True
                logger.warning("%s: ZooKeeper session lost; refusing produce until the state is read again", part.name)

    def _reread_all(self) -> None:
        with self._lock:
            watched = dict(self._watched)
        for (topic, partition), replicas in watched.items():
            try:
                found = read_partition_state(self.zk, topic, partition)
            except Exception as exc:
                logger.warning("could not re-read the state of %s-%d: %s", topic, partition, exc)
                continue
            if found is not None:
                self._loop.call_soon_threadsafe(self.apply_state, topic, partition, replicas, found)

    async def _shrink_isr(self) -> None:
        await self.isr.shrink_lagging(list(self.partitions.values()))

    # ------------------------------------------------------------ what handlers ask

    def leader_of(self, topic: str, partition: int, replicas: list[int]) -> int:
        """The leader this broker knows of; the preferred replica before it knows."""
        part = self.partitions.get((topic, partition))
        return replicas[0] if part is None or part.epoch < 0 else part.state.leader

    def leader_partition(self, topic: str, partition: int) -> Partition:
        """The partition if this broker leads it and may take produce, else the error."""
        part = self.partitions.get((topic, partition))
        if part is not None and part.is_leader and not part.fenced:
            return part
        if part is not None and part.state.leader == -1 and part.epoch >= 0:
            raise PartitionOffline(f"partition {topic}-{partition} has no leader (no eligible replica is alive)")
        leader = part.state.leader if part is not None else -1
        where = self.registry.view.brokers.get(leader)
        raise NotLeaderForPartition(
            f"partition {topic}-{partition} is not led by broker {self.config.broker_id}"
            + (" (fenced until its ZooKeeper session's state is re-read)" if part is not None and part.fenced else "")
            + (f"; it is led by broker {leader} ({where.host}:{where.port})" if where else "")
        )

    def check_insync(self, part: Partition) -> None:
        """acks=-1 is refused, before anything is appended, with too few in sync (counting
        a shrink being written as done)."""
        isr = part.isr if part.shrinking is None else part.shrinking
        if len(isr) < self.config.min_insync_replicas:
            raise NotEnoughReplicas(
                f"partition {part.name} has {len(isr)} in-sync replica(s) {isr}, fewer than "
                f"min.insync.replicas={self.config.min_insync_replicas}; nothing was appended"
            )

    async def wait_committed(self, log: Log, offset: int, epoch: int, timeout_ms: int) -> None:
        """acks=-1 on a replicated partition: until the high watermark covers `offset`,
        appended as leader of `epoch` (`Partition.wait_committed`)."""
        part = self.partitions.get((log.topic, log.partition))
        if part is None:
            raise NotLeaderForPartition(f"partition {log.name} is not replicated here")
        await part.wait_committed(offset, epoch, timeout_ms)

    async def replica_fetch(self, req: ReplicaFetchRequest) -> Body:
        return await self.sessions.replica_fetch(req)

    def leader_epoch_end(self, req: LeaderEpochEndRequest) -> Body:
        return self.sessions.leader_epoch_end(req)
