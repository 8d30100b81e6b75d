"""Blocks of producer ids claimed in ZooKeeper (docs/zookeeper.md, "Producer id
blocks"; Kafka's KIP-730): `/latest_producer_id_block`, rewritten by compare-and-set by
the broker that claims the next block for its idempotent producers."""

from __future__ import annotations

import json

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from broker.common.errors import UnknownError
from broker.common.zklayout import PRODUCER_ID_BLOCK, PRODUCER_ID_BLOCK_SIZE


def claim_producer_id_block(zk: KazooClient, broker_id: int, attempts: int = 50) -> tuple[int, int]:
    """Claim the next block of producer ids, [start, end), for `broker_id` (KIP-730):
    rewrite the node by compare-and-set, the block starting at PRODUCER_ID_BLOCK_SIZE ×
    the zxid of the node's last write. zxids only grow, one per write, so each claim
    reads a larger one than the claim before: no id is handed out twice, whatever became
    of the node (deleted: it is created empty, and that creation counts; rewritten: that
    write counts). Its contents tell operators, and older brokers, the last block."""
    for _ in range(attempts):
        try:
            _, stat = zk.get(PRODUCER_ID_BLOCK)
        except NoNodeError:
            zk.ensure_path(PRODUCER_ID_BLOCK)
            continue
        start, end = stat.mzxid * PRODUCER_ID_BLOCK_SIZE, (stat.mzxid + 1) * PRODUCER_ID_BLOCK_SIZE
        block = json.dumps({"broker": broker_id, "block_start": start, "block_end": end}).encode()
        try:
            zk.set(PRODUCER_ID_BLOCK, block, version=stat.version)
            return start, end
        except BadVersionError:
            continue
    raise UnknownError(f"could not claim a block of producer ids after {attempts} concurrent claims")
