"""The broker's replicas: which replicated partitions it leads or follows, learnt from
the partition state nodes in ZooKeeper (the controller writes them; this broker writes
only ISR changes of partitions it leads, by compare-and-set), and the requests only
replication uses (REPLICA_FETCH, LEADER_EPOCH_END). docs/replication.md.

Partitions with one replica never come here: they behave exactly as before replication.
kazoo calls back in its own threads; everything that touches a `Partition` is moved to
the event loop with `call_soon_threadsafe`, and ZooKeeper calls run in the executor.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from kazoo.client import KazooClient, KazooState
from kazoo.recipe.watchers import DataWatch

from broker.config import BrokerConfig
from broker.errors import (
    ErrorCode, FencedLeaderEpoch, InvalidRequest, LogbusError, NotEnoughReplicas, NotLeaderForPartition,
    OffsetOutOfRange, PartitionOffline, UnknownPartition,
)
from broker.log.log import Log
from broker.log.manager import LogManager
from broker.log.segment import EMPTY
from broker.log.scheduler import FlushScheduler
from broker.protocol import (
    Body, BrokerInfo, LeaderEpochEndRequest, LeaderEpochEndResponse, PartitionResult, ReplicaFetchPartition,
    ReplicaFetchRequest, ReplicaFetchResponse, encode_results,
)
from broker.registration import BrokerRegistry
from broker.replication.fetcher import SourceFetcher
from broker.replication.partition import Partition, Role, wait_for_any_append
from broker.zklayout import (
    PartitionState, StateNode, partition_state_path, read_partition_state, write_partition_state,
)

logger = logging.getLogger(__name__)

Key = tuple[str, int]


@dataclass
class SessionEntry:
    """One partition of a follower's fetch session, as the leader keeps it: the fetch it
    last named, the refusal of that fetch if any, and the (high watermark, epoch) last
    answered, so that an unchanged partition is left out of the answer."""

    fetch: ReplicaFetchPartition
    error: PartitionResult | None = None
    told: tuple[int, int] | None = None


class ReplicaManager:
    def __init__(self, config: BrokerConfig, logs: LogManager, scheduler: FlushScheduler,
                 registry: BrokerRegistry, zk: KazooClient) -> None:
        self.config = config
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
        self._isr_writes: set[asyncio.Task] = set()
        self._sessions: dict[int, dict[Key, SessionEntry]] = {}  # follower id -> its fetch session
        self._unregistered_noted: set[tuple[str, int]] = set()  # (partition, follower) logged as unregistered

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

    def _state_watcher(self, topic: str, partition: int, replicas: list[int]):
        # exactly two parameters: kazoo passes a third (the event) to callbacks that take one
        def watch(data: bytes | None, stat) -> None:
            if data is None:  # created before replication: the first replica leads alone
                node = StateNode(PartitionState(replicas[0], 0, [replicas[0]]), -1)
            else:
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
                log, self.config.broker_id, replicas, self.scheduler.flusher(log), self.config.min_insync_replicas)
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
                                                                self._broker)
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

    # --------------------------------------------------------------------- ISR changes

    async def _shrink_isr(self) -> None:
        lag = self.config.replica_lag_time_max_ms / 1000
        for part in list(self.partitions.values()):
            if part.is_leader and not part.fenced and not part.isr_change_pending:
                out = part.lagging(lag)
                if out:
                    logger.info("%s: followers %s have not caught up within replica.lag.time.max.ms=%d; "
                                "removing them from the isr", part.name, out, self.config.replica_lag_time_max_ms)
                    await self._change_isr(part, [r for r in part.isr if r not in out])

    async def _change_isr(self, part: Partition, isr: list[int]) -> None:
        """Compare-and-set the ISR on the state node, same leader and epoch; on a lost
        race re-read it (the controller may have moved leadership) and apply that."""
        part.isr_change_pending = True
        if len(isr) < len(part.isr):
            part.shrinking = isr
        state, version = part.state, part.zk_version
        wanted = PartitionState(state.leader, state.leader_epoch, isr, state.controller_epoch, state.version)
        loop = asyncio.get_running_loop()
        topic, partition = part.log.topic, part.log.partition
        try:
            new_version = await loop.run_in_executor(
                None, write_partition_state, self.zk, topic, partition, wanted, version)
            if new_version is not None:
                part.update_isr(wanted, new_version)
            else:
                found = await loop.run_in_executor(None, read_partition_state, self.zk, topic, partition)
                if found is not None:
                    self.apply_state(topic, partition, part.replicas, found)
        except Exception as exc:  # ZooKeeper unavailable: try again on the next check or fetch
            logger.warning("%s: could not change the isr to %s: %s", part.name, isr, exc)
        finally:
            part.isr_change_pending = False
            part.joining = None
            part.shrinking = None

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
            + (f" (fenced until its ZooKeeper session's state is re-read)" if part is not None and part.fenced else "")
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

    def appended(self, topic: str, partition: int) -> None:
        part = self.partitions.get((topic, partition))
        if part is not None:
            part.appended()

    async def wait_committed(self, log: Log, offset: int, epoch: int, timeout_ms: int) -> None:
        """acks=-1 on a replicated partition: until the high watermark covers `offset`,
        appended as leader of `epoch` (`Partition.wait_committed`)."""
        part = self.partitions.get((log.topic, log.partition))
        if part is None:
            raise NotLeaderForPartition(f"partition {log.name} is not replicated here")
        await part.wait_committed(offset, epoch, timeout_ms)

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
                self._record_fetch(self._led_for_replication(fetch.topic, fetch.partition, fetch.leader_epoch),
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
            session = self._sessions[req.replica_id] = {}
            return session
        session = self._sessions.get(req.replica_id)
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
            self._record_fetch(part, replica_id, entry.fetch)
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
            if result.error_code == ErrorCode.NONE:
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
        return PartitionResult(ErrorCode.NONE, ReplicaFetchResponse(part.high_watermark, part.epoch, region))

    def _record_fetch(self, part: Partition, replica_id: int, fetch: ReplicaFetchPartition) -> None:
        """Record a follower's fetch; add it to the ISR once it has caught up — only if it
        is registered in ZooKeeper: a broker whose session expired still fetches, but
        the controller has taken it out of the ISR and would elect no leader from it
        (Kafka's KIP-841); it rejoins once it has registered again."""
        if not part.record_fetch(replica_id, fetch.fetch_offset, fetch.flushed_offset) or part.isr_change_pending:
            return
        if replica_id not in self.registry.view.brokers:
            if (part.name, replica_id) not in self._unregistered_noted:
                self._unregistered_noted.add((part.name, replica_id))
                logger.info("%s: follower %d has caught up but is not registered in ZooKeeper; it stays out of "
                            "the isr until it registers again", part.name, replica_id)
            return
        self._unregistered_noted.discard((part.name, replica_id))
        logger.info("%s: follower %d caught up at %d; adding it to the isr", part.name, replica_id,
                    fetch.fetch_offset)
        part.isr_change_pending = True  # until the write below is done: one at a time
        part.joining = replica_id  # counts for the HW before the write (see Partition.joining)
        task = asyncio.ensure_future(self._change_isr(part, [*part.isr, replica_id]))
        self._isr_writes.add(task)  # a reference, so the task is not collected while it runs
        task.add_done_callback(self._isr_writes.discard)

    def leader_epoch_end(self, req: LeaderEpochEndRequest) -> Body:
        part = self.partitions.get((req.topic, req.partition))
        if part is None or not part.is_leader:
            raise NotLeaderForPartition(f"broker {self.config.broker_id} does not lead {req.topic}-{req.partition}")
        epoch, end = part.log.epochs.end_offset_for(req.leader_epoch, part.log.end_offset)
        return [LeaderEpochEndResponse(epoch, end).encode()]
