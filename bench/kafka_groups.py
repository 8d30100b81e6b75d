"""What the Kafka group coordinator costs per request (not a test; docs/kafka.md,
"Consumer groups"): `GroupRequests` driven in one process with kio requests against a
real ZooKeeper server (harness), no sockets — Heartbeat (in memory), OffsetCommit of 1
and of 50 partitions (one guarded ZooKeeper transaction each), OffsetFetch of 50, and a
rebalance of `--members` members from their first JoinGroup to the last SyncGroup
answer (one generation written to ZooKeeper). Medians of `--rounds`.

    PYTHONPATH=$PWD .venv/bin/python -m bench.kafka_groups --requests 500 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import tempfile
import time
from pathlib import Path

from kazoo.client import KazooClient
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.offset_commit.v9.request import (
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopics
from kio.schema.sync_group.v5.request import SyncGroupRequest, SyncGroupRequestAssignment

from broker.common.listeners import Endpoint, SecurityProtocol
from broker.common.protocol import BrokerInfo
from broker.server.auth.listeners import Listener
from broker.server.auth.rules import RequestRules
from broker.server.auth.session import Session
from broker.server.controllernode import bump_controller_epoch, claim_controller_node
from broker.server.kafka.coordinator import GroupSettings
from broker.server.kafka.groups import GroupRequests
from broker.server.registration import BrokerRegistry
from harness.zookeeper import ZooKeeperServer

SESSION = Session(Listener("KAFKA", SecurityProtocol.PLAINTEXT, Endpoint("KAFKA", "127.0.0.1", 0),
                           Endpoint("KAFKA", "127.0.0.1", 0)), "127.0.0.1")
SECONDS = datetime.timedelta(seconds=30)


async def join(groups: GroupRequests, group: str, members: int) -> tuple[float, list[tuple[str, int]]]:
    """Seconds from the first JoinGroup to the last SyncGroup answer; (member, generation)."""
    async def one() -> tuple[str, int]:
        member_id = ""
        while True:
            answer = await groups.join_group(JoinGroupRequest(
                group_id=group, session_timeout=SECONDS, rebalance_timeout=SECONDS, member_id=member_id,
                protocol_type="consumer", protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),)),
                9, SESSION)
            member_id = answer.member_id
            if answer.error_code == 0:
                break
        assignments = tuple(SyncGroupRequestAssignment(member_id=m.member_id, assignment=b"a") for m in answer.members)
        await groups.sync_group(SyncGroupRequest(group_id=group, generation_id=answer.generation_id,
                                                 member_id=member_id, assignments=assignments), 5, SESSION)
        return member_id, answer.generation_id

    start = time.perf_counter()
    joined = await asyncio.gather(*(one() for _ in range(members)))
    return time.perf_counter() - start, joined


async def per_request(requests: int, call) -> float:
    start = time.perf_counter()
    for _ in range(requests):
        await call()
    return (time.perf_counter() - start) / requests


async def one_round(groups: GroupRequests, round_: int, requests: int, members: int) -> dict[str, float]:
    await groups.start()
    rebalance, joined = await join(groups, f"g{round_}", members)
    member, generation = joined[0]
    group = f"g{round_}"

    def commit(partitions: int):
        topic = OffsetCommitRequestTopic(name="t", partitions=tuple(OffsetCommitRequestPartition(
            partition_index=p, committed_offset=1000 + p, committed_metadata="") for p in range(partitions)))
        return lambda: groups.offset_commit(OffsetCommitRequest(
            group_id=group, generation_id_or_member_epoch=generation, member_id=member, topics=(topic,)), 9, SESSION)

    fetch = OffsetFetchRequest(groups=(OffsetFetchRequestGroup(group_id=group, topics=(
        OffsetFetchRequestTopics(name="t", partition_indexes=tuple(range(50))),)),))
    heartbeat = HeartbeatRequest(group_id=group, generation_id=generation, member_id=member)
    out = {"heartbeat": await per_request(requests, lambda: groups.heartbeat(heartbeat, 4, SESSION)) * 1e6,
           "commit 1 partition": await per_request(requests, commit(1)) * 1e3,
           "commit 50 partitions": await per_request(max(1, requests // 10), commit(50)) * 1e3,
           "fetch 50 partitions": await per_request(max(1, requests // 10),
                                                    lambda: groups.offset_fetch(fetch, 8, SESSION)) * 1e3,
           f"rebalance of {members} members": rebalance * 1e3}
    await groups.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="logbus-bench-groups-") as scratch:
        server = ZooKeeperServer(Path(scratch)).start()
        zk = KazooClient(server.connect_string)
        try:
            zk.start(30)
            registry = BrokerRegistry(zk, BrokerInfo(1, "127.0.0.1", 9092, (Endpoint("KAFKA", "127.0.0.1", 9093),)),
                                      lambda topic, assignment: None, 6000)
            registry.start()
            registry.register()
            registry.create_topic("t", 50)
            claim_controller_node(zk, 1)
            bump_controller_epoch(zk)
            groups = GroupRequests(zk, 1, registry, RequestRules(None, lambda: {}),
                                   GroupSettings(initial_rebalance_delay=0.0))
            rounds = [asyncio.run(one_round(groups, r, args.requests, args.members)) for r in range(args.rounds)]
        finally:
            registry.states.close()
            zk.stop()
            zk.close()
            server.stop()
    units = {"heartbeat": "us/request"}
    for name in rounds[0]:
        unit = units.get(name, "ms" if name.startswith("rebalance") else "ms/request")
        print(f"{name:<28} {statistics.median(r[name] for r in rounds):>10.3f} {unit}")


if __name__ == "__main__":
    main()
