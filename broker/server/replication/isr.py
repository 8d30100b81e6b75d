"""The ISR changes a leader makes (docs/replication.md, "In sync"): it removes the
followers that lag, and adds back a follower that has caught up, has the high
watermark on its disk and is registered — each by compare-and-set on the partition's
state node, applied locally only once written; a lost race re-reads the node (the
controller may have moved leadership meanwhile) and hands it to the roles.

Runs on the event loop; the ZooKeeper calls run in the executor.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from kazoo.client import KazooClient

from broker.common.zklayout import PartitionState, StateNode, read_partition_state, write_partition_state
from broker.server.config import BrokerConfig
from broker.server.registration import BrokerRegistry
from broker.server.replication.partition import Partition

logger = logging.getLogger(__name__)


class IsrChanges:
    def __init__(self, config: BrokerConfig, registry: BrokerRegistry, zk: KazooClient,
                 on_lost_race: Callable[[str, int, list[int], StateNode], None]) -> None:
        self.config = config
        self.registry = registry
        self.zk = zk
        self.on_lost_race = on_lost_race  # applies the state another writer left
        self._writes: set[asyncio.Task] = set()
        self._unregistered_noted: set[tuple[str, int]] = set()  # (partition, follower) logged as unregistered

    async def shrink_lagging(self, partitions: list[Partition]) -> None:
        """Remove from the ISR of every partition this broker leads the followers that
        have not caught up within replica.lag.time.max.ms."""
        lag = self.config.replica_lag_time_max_ms / 1000
        for part in partitions:
            if part.is_leader and not part.fenced and not part.isr_change_pending:
                out = part.lagging(lag)
                if out:
                    logger.info("%s: followers %s have not caught up within replica.lag.time.max.ms=%d; "
                                "removing them from the isr", part.name, out, self.config.replica_lag_time_max_ms)
                    await self._change(part, [r for r in part.isr if r not in out])

    async def _change(self, part: Partition, isr: list[int]) -> None:
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
                    self.on_lost_race(topic, partition, part.replicas, found)
        except Exception as exc:  # ZooKeeper unavailable: try again on the next check or fetch
            logger.warning("%s: could not change the isr to %s: %s", part.name, isr, exc)
        finally:
            part.isr_change_pending = False
            part.joining = None
            part.shrinking = None

    def expand(self, part: Partition, replica_id: int) -> None:
        """Add a caught-up follower to the ISR — only if it is registered in ZooKeeper: a
        broker whose session expired still fetches, but the controller has taken it out
        of the ISR and would elect no leader from it (Kafka's KIP-841); it rejoins once
        it has registered again. One change at a time per partition."""
        if part.isr_change_pending:
            return
        if replica_id not in self.registry.view.brokers:
            if (part.name, replica_id) not in self._unregistered_noted:
                self._unregistered_noted.add((part.name, replica_id))
                logger.info("%s: follower %d has caught up but is not registered in ZooKeeper; it stays out of "
                            "the isr until it registers again", part.name, replica_id)
            return
        self._unregistered_noted.discard((part.name, replica_id))
        logger.info("%s: follower %d caught up at %d; adding it to the isr", part.name, replica_id,
                    part.followers[replica_id].fetch_offset)
        part.isr_change_pending = True  # until the write below is done: one at a time
        part.joining = replica_id  # counts for the HW before the write (see Partition.joining)
        task = asyncio.ensure_future(self._change(part, [*part.isr, replica_id]))
        self._writes.add(task)  # a reference, so the task is not collected while it runs
        task.add_done_callback(self._writes.discard)
