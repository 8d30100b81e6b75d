"""Producer ids for idempotent producers (docs/protocol.md, INIT_PRODUCER_ID): each
broker hands out ids from a block it claimed in ZooKeeper by compare-and-set
(`zklayout.claim_producer_id_block`, Kafka's KIP-730), so ids are unique across the
cluster and across restarts without a ZooKeeper write per producer — even if the block
node is lost. A restarted broker claims a fresh block; the ids left in its old one are
never used."""

from __future__ import annotations

import threading

from kazoo.client import KazooClient

from broker.common.produceridblocks import claim_producer_id_block


class ProducerIdAllocator:
    """Thread-safe; `allocate` blocks on ZooKeeper once per block of ids
    (`zklayout.PRODUCER_ID_BLOCK_SIZE`), so call it off the event loop."""

    def __init__(self, zk: KazooClient, broker_id: int) -> None:
        self.zk = zk
        self.broker_id = broker_id
        self._lock = threading.Lock()
        self._next = self._end = 0

    def allocate(self) -> int:
        with self._lock:
            if self._next >= self._end:
                self._next, self._end = claim_producer_id_block(self.zk, self.broker_id)
            producer_id = self._next
            self._next += 1
            return producer_id
