"""What the Kafka group tests share: a broker's registration and the controller role in
a real ZooKeeper (the real `BrokerRegistry` and the controller's own node functions),
`GroupRequests` built over them, kio requests of any version, and a consumer that
speaks the classic protocol the way Kafka clients do (join with MEMBER_ID_REQUIRED,
sync, heartbeat, commit). Every response is encoded and decoded by kio's codec, so a
field of the wrong type or version fails here as it would on the wire."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import io
import json
import sys
from typing import Any

from kazoo.client import KazooClient
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from broker.common.kafka.apis import ApiKey
from broker.common.listeners import Endpoint, SecurityProtocol
from broker.common.protocol import BrokerInfo
from broker.server.auth.listeners import Listener
from broker.server.auth.rules import RequestRules
from broker.server.auth.session import Session
from broker.server.controllernode import bump_controller_epoch, claim_controller_node
from broker.server.kafka.coordinator import GroupSettings
from broker.server.kafka.groups import GroupRequests
from broker.server.registration import BrokerRegistry

FAST = GroupSettings(min_session_timeout=0.5, max_session_timeout=60.0, initial_rebalance_delay=0.0)
KAFKA = Listener("KAFKA", SecurityProtocol.PLAINTEXT, Endpoint("KAFKA", "127.0.0.1", 0),
                 Endpoint("KAFKA", "127.0.0.1", 0))
METHODS = {ApiKey.FIND_COORDINATOR: "find_coordinator", ApiKey.JOIN_GROUP: "join_group",
           ApiKey.SYNC_GROUP: "sync_group", ApiKey.HEARTBEAT: "heartbeat", ApiKey.LEAVE_GROUP: "leave_group",
           ApiKey.OFFSET_COMMIT: "offset_commit", ApiKey.OFFSET_FETCH: "offset_fetch",
           ApiKey.LIST_GROUPS: "list_groups", ApiKey.DESCRIBE_GROUPS: "describe_groups"}


def session(principal: str = "User:ANONYMOUS", listener: Listener = KAFKA) -> Session:
    return Session(listener, "127.0.0.1", principal)


def ms(milliseconds: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=milliseconds)


def request(api_key: int, version: int, **fields: Any) -> Any:
    cls = load_request_schema(api_key, version)
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in names})


def nested(api_key: int, version: int, entity_name: str, /, **fields: Any) -> Any:
    cls = getattr(sys.modules[load_request_schema(api_key, version).__module__], entity_name)
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in names})


def on_the_wire(message: Any) -> Any:
    """The response as a client reads it: encoded and decoded by kio."""
    out = io.BytesIO()
    entity_writer(type(message))(out, message)
    decoded, _ = entity_reader(type(message))(memoryview(out.getvalue()), 0)
    return decoded


async def call(groups: GroupRequests, api_key: int, version: int, who: Session | None = None, /,
               **fields: Any) -> Any:
    handler = getattr(groups, METHODS[api_key])
    return on_the_wire(await handler(request(api_key, version, **fields), version, who or session()))


class Node:
    """One broker as the coordinator sees it: its own ZooKeeper session, its
    registration (with a KAFKA endpoint), and `GroupRequests` over them."""

    def __init__(self, zk_connect: str, broker_id: int, rules: RequestRules | None = None,
                 settings: GroupSettings = FAST, zk_timeout: float = 10.0) -> None:
        self.zk = KazooClient(zk_connect, timeout=zk_timeout)
        self.zk.start(30)
        endpoints = (Endpoint("PLAINTEXT", "127.0.0.1", 9000 + broker_id), Endpoint("KAFKA", "127.0.0.1",
                                                                                     9100 + broker_id))
        self.registry = BrokerRegistry(self.zk, BrokerInfo(broker_id, "127.0.0.1", 9000 + broker_id, endpoints),
                                       lambda topic, assignment: None, 6000)
        self.registry.start()
        self.registry.register()
        self.broker_id = broker_id
        self.groups = GroupRequests(self.zk, broker_id, self.registry, rules or RequestRules(None, lambda: {}),
                                    settings)

    def become_controller(self) -> None:
        assert claim_controller_node(self.zk, self.broker_id) is not None
        bump_controller_epoch(self.zk)

    def close_quietly(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def close(self) -> None:
        self.registry.states.close()
        self.zk.stop()
        self.zk.close()


def assignment_of(partitions: list[int]) -> bytes:
    return json.dumps(partitions).encode()


class Consumer:
    """A group member as Kafka clients behave: JoinGroup (again after
    MEMBER_ID_REQUIRED, and anew after UNKNOWN_MEMBER_ID), SyncGroup (the leader assigns the topic's partitions round
    robin), Heartbeat, OffsetCommit."""

    def __init__(self, groups: GroupRequests, group: str, partitions: int, session_ms: int = 1000,
                 version: int = 5, who: Session | None = None) -> None:
        self.groups, self.group, self.partitions = groups, group, partitions
        self.session_ms, self.version, self.who = session_ms, version, who or session()
        self.member_id = ""
        self.generation = -1
        self.assigned: list[int] = []

    async def join(self) -> Any:
        while True:
            answer = await call(self.groups, ApiKey.JOIN_GROUP, self.version, self.who, group_id=self.group,
                                session_timeout=ms(self.session_ms), rebalance_timeout=ms(5000),
                                member_id=self.member_id, protocol_type="consumer", protocols=(
                                    nested(ApiKey.JOIN_GROUP, self.version, "JoinGroupRequestProtocol",
                                           name="roundrobin", metadata=b"t"),))
            if answer.error_code == ErrorCode.unknown_member_id and self.member_id:
                self.member_id = ""  # expired while idle (a rebalance it sat out): join anew, as Kafka's clients do
                continue
            self.member_id = answer.member_id
            if answer.error_code != ErrorCode.member_id_required:
                break
        assert answer.error_code == ErrorCode.none, answer
        self.generation = answer.generation_id
        assignments = ()
        if answer.leader == self.member_id:
            members = sorted(m.member_id for m in answer.members)
            assignments = tuple(
                nested(ApiKey.SYNC_GROUP, 3, "SyncGroupRequestAssignment", member_id=m,
                       assignment=assignment_of([p for p in range(self.partitions) if p % len(members) == i]))
                for i, m in enumerate(members))
        synced = await call(self.groups, ApiKey.SYNC_GROUP, 3, self.who, group_id=self.group,
                            generation_id=self.generation, member_id=self.member_id, assignments=assignments)
        if synced.error_code == ErrorCode.rebalance_in_progress:
            return await self.join()
        assert synced.error_code == ErrorCode.none, synced
        self.assigned = json.loads(synced.assignment)
        return answer

    async def heartbeat(self) -> ErrorCode:
        answer = await call(self.groups, ApiKey.HEARTBEAT, 3, self.who, group_id=self.group,
                            generation_id=self.generation, member_id=self.member_id)
        return answer.error_code

    async def keep_alive(self, interval: float = 0.1) -> None:
        """Heartbeat until told to rebalance, then rejoin; forever (cancel to stop)."""
        while True:
            if await self.heartbeat() == ErrorCode.rebalance_in_progress:
                await self.join()
            await asyncio.sleep(interval)

    async def commit(self, topic: str, offsets: dict[int, int], version: int = 8) -> dict[int, ErrorCode]:
        answer = await call(self.groups, ApiKey.OFFSET_COMMIT, version, self.who, group_id=self.group,
                            generation_id_or_member_epoch=self.generation, member_id=self.member_id,
                            topics=(commit_topic(version, topic, offsets),))
        return {p.partition_index: p.error_code for p in answer.topics[0].partitions}


def commit_topic(version: int, topic: str, offsets: dict[int, int]) -> Any:
    return nested(ApiKey.OFFSET_COMMIT, version, "OffsetCommitRequestTopic", name=topic, partitions=tuple(
        nested(ApiKey.OFFSET_COMMIT, version, "OffsetCommitRequestPartition", partition_index=p,
               committed_offset=o, committed_metadata="") for p, o in offsets.items()))
