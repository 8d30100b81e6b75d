"""Kafka groups' committed offsets (docs/kafka.md, "Consumer groups"), against a real
ZooKeeper: every served OffsetCommit/OffsetFetch version, a stale generation refused,
offsets and generations surviving the coordinator (a fresh coordinator on another
broker reads them), a deposed coordinator unable to write, and the ACLs."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from kio.schema.errors import ErrorCode

from broker.client.offsets import group_offsets
from broker.common.acls import AclEntry, Operation, Resource, ResourceType, change_acls
from broker.common.kafka.apis import SERVED, ApiKey
from broker.common.zklayout import CONTROLLER
from broker.server.auth.authorizer import Authorizer
from broker.server.auth.rules import RequestRules
from broker.server.kafka.groupstore import CoordinatorFenced, GroupStore
from harness.process import wait_until
from harness.proxy import TcpProxy
from broker.server.controllernode import bump_controller_epoch, claim_controller_node
from tests.unit.kafka_group_support import FAST, Consumer, Node, call, commit_topic, ms, nested, session


@pytest.fixture
def coordinator(zk_connect):
    node = Node(zk_connect, 1)
    node.become_controller()
    node.registry.create_topic("t", 4)
    node.registry.create_topic("u", 1)
    yield node
    node.close()


def fetch_fields(version: int, group: str, topics: dict[str, list[int]] | None) -> dict:
    asked = None if topics is None else tuple(
        nested(ApiKey.OFFSET_FETCH, version, "OffsetFetchRequestTopics" if version >= 8 else "OffsetFetchRequestTopic",
               name=t, partition_indexes=tuple(ps)) for t, ps in topics.items())
    if version >= 8:
        return dict(groups=(nested(ApiKey.OFFSET_FETCH, version, "OffsetFetchRequestGroup", group_id=group,
                                   topics=asked),))
    return dict(group_id=group, topics=asked)


def fetched(answer, version: int) -> dict[tuple[str, int], tuple[int, ErrorCode]]:
    topics = answer.groups[0].topics if version >= 8 else answer.topics
    return {(t.name, p.partition_index): (p.committed_offset, p.error_code) for t in topics for p in t.partitions}


def simple_commit(version: int, group: str, topic: str, offsets: dict[int, int]) -> dict:
    return dict(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                topics=(commit_topic(version, topic, offsets),))


def test_every_served_version_commits_and_fetches_offsets_kept_where_native_groups_keep_them(coordinator):
    commit_low, commit_high = SERVED[ApiKey.OFFSET_COMMIT]
    fetch_low, fetch_high = SERVED[ApiKey.OFFSET_FETCH]

    async def scenario():
        await coordinator.groups.start()
        out = {}
        for version in range(commit_low, commit_high + 1):
            committed = await call(coordinator.groups, ApiKey.OFFSET_COMMIT, version,
                                   **simple_commit(version, "g", "t", {0: 1000 + version, 1: 7}))
            assert [p.error_code for p in committed.topics[0].partitions] == [ErrorCode.none] * 2
            for fetch_version in range(fetch_low, fetch_high + 1):
                answer = await call(coordinator.groups, ApiKey.OFFSET_FETCH, fetch_version,
                                    **fetch_fields(fetch_version, "g", {"t": [0, 1, 2]}))
                out[(version, fetch_version)] = fetched(answer, fetch_version)
        everything = await call(coordinator.groups, ApiKey.OFFSET_FETCH, 8, **fetch_fields(8, "g", None))
        await coordinator.groups.stop()
        return out, everything

    out, everything = asyncio.run(scenario())
    for (version, _), answer in out.items():
        assert answer == {("t", 0): (1000 + version, ErrorCode.none), ("t", 1): (7, ErrorCode.none),
                          ("t", 2): (-1, ErrorCode.none)}
    assert fetched(everything, 8) == {("t", 0): (1000 + commit_high, ErrorCode.none), ("t", 1): (7, ErrorCode.none)}
    assert group_offsets(coordinator.zk, "g", "t", [0, 1, 2]) == {0: 1000 + commit_high, 1: 7}, \
        "the native readers (lag sensor, logbus groups describe) see the Kafka group's offsets"


def test_a_commit_from_a_stale_generation_is_refused_and_moves_nothing(coordinator):
    async def scenario():
        await coordinator.groups.start()
        member = Consumer(coordinator.groups, "g", 4)
        await member.join()
        first = await member.commit("t", {0: 500})
        zombie = Consumer(coordinator.groups, "g", 4)
        zombie.member_id, zombie.generation = member.member_id, member.generation
        await member.join()  # the leader rejoins: a new generation
        stale = await zombie.commit("t", {0: 100})
        current = await member.commit("t", {1: 900})
        others = await call(coordinator.groups, ApiKey.OFFSET_COMMIT, 8, **simple_commit(8, "g", "t", {0: 1}))
        bad = await call(coordinator.groups, ApiKey.OFFSET_COMMIT, 8, **simple_commit(8, "empty", "t", {9: 1, 2: -5}))
        await coordinator.groups.stop()
        return member, first, stale, current, others, bad

    member, first, stale, current, others, bad = asyncio.run(scenario())
    assert member.generation == 2
    assert first == {0: ErrorCode.none} and current == {1: ErrorCode.none}
    assert stale == {0: ErrorCode.illegal_generation}
    assert others.topics[0].partitions[0].error_code == ErrorCode.unknown_member_id, \
        "no generation -1 commits to a group with members"
    assert [p.error_code for p in bad.topics[0].partitions] == [ErrorCode.unknown_topic_or_partition,
                                                                 ErrorCode.invalid_commit_offset_size]
    assert group_offsets(coordinator.zk, "g", "t", [0, 1]) == {0: 500, 1: 900}
    assert group_offsets(coordinator.zk, "empty", "t", [2, 9]) == {}


def test_offsets_and_generations_outlive_the_coordinator(coordinator, zk_connect):
    """The coordinator's broker dies (its session ends, as after a kill -9); the next
    controller, a fresh coordinator, serves the offsets, refuses the old generation's
    members and makes a later generation."""
    async def before():
        await coordinator.groups.start()
        member = Consumer(coordinator.groups, "g", 4)
        await member.join()
        await member.join()
        assert await member.commit("t", {0: 300, 3: 40}) == {0: ErrorCode.none, 3: ErrorCode.none}
        await coordinator.groups.stop()
        return member

    member = asyncio.run(before())
    coordinator.close()
    successor = Node(zk_connect, 2)
    try:
        successor.become_controller()

        async def after():
            await successor.groups.start()
            member.groups = successor.groups
            refused = await member.commit("t", {0: 10})
            offsets = await call(successor.groups, ApiKey.OFFSET_FETCH, 5, **fetch_fields(5, "g", {"t": [0, 3]}))
            newcomer = Consumer(successor.groups, "g", 4)
            await newcomer.join()
            await successor.groups.stop()
            return refused, offsets, newcomer

        refused, offsets, newcomer = asyncio.run(after())
        assert refused == {0: ErrorCode.unknown_member_id}
        assert fetched(offsets, 5) == {("t", 0): (300, ErrorCode.none), ("t", 3): (40, ErrorCode.none)}
        assert newcomer.generation == member.generation + 1, "generations keep increasing across coordinators"
        assert group_offsets(successor.zk, "g", "t", [0, 3]) == {0: 300, 3: 40}
    finally:
        successor.close()


def test_a_deposed_coordinator_cannot_write(coordinator, zk_connect):
    """Another broker became the controller while the old one still runs (a long pause,
    its session lost): its members' commits get NOT_COORDINATOR, and a write the old
    coordinator makes before it notices fails on the /controller_epoch check."""
    store = GroupStore(coordinator.zk, 1)
    old_epoch = store.coordinator().epoch_version
    assert old_epoch is not None

    async def before():
        await coordinator.groups.start()
        member = Consumer(coordinator.groups, "g", 4)
        await member.join()
        assert await member.commit("t", {0: 300}) == {0: ErrorCode.none}
        return member

    successor = Node(zk_connect, 2)
    try:
        async def scenario():
            member = await before()
            coordinator.zk.delete(CONTROLLER)  # as its session's end would
            successor.become_controller()
            refused = await member.commit("t", {0: 5})
            await coordinator.groups.stop()
            return refused

        assert asyncio.run(scenario()) == {0: ErrorCode.not_coordinator}
        with pytest.raises(CoordinatorFenced):
            store.commit("g", {("t", 0): 6}, old_epoch)
        with pytest.raises(CoordinatorFenced):
            store.commit("g", {("t", 2): 6}, old_epoch)
        assert group_offsets(coordinator.zk, "g", "t", [0, 2]) == {0: 300}
    finally:
        successor.close()


def test_group_and_topic_acls_refuse_with_kafka_error_codes(zk_connect, zk):
    authorizer = Authorizer(zk, super_users=(), allow_if_no_acl=False)
    authorizer.start()
    change_acls(zk, Resource(ResourceType.GROUP, "g"), [AclEntry("User:alice", Operation.READ)])
    change_acls(zk, Resource(ResourceType.TOPIC, "t"), [AclEntry("User:alice", Operation.READ)])
    wait_until(lambda: authorizer.allowed(session("User:alice"), Operation.READ, ResourceType.TOPIC, "t"), 10,
               "the ACLs to reach the authorizer")
    node = Node(zk_connect, 1, rules=RequestRules(authorizer, lambda: {}))
    alice, bob = session("User:alice"), session("User:bob")
    try:
        node.become_controller()
        node.registry.create_topic("t", 2)
        node.registry.create_topic("u", 2)

        async def scenario():
            await node.groups.start()
            member = Consumer(node.groups, "g", 2, who=alice)
            await member.join()
            answers = dict(
                commit=await member.commit("t", {0: 11}) | {("u", p): e for p, e in
                                                            (await member.commit("u", {0: 12})).items()},
                fetch_all=fetched(await call(node.groups, ApiKey.OFFSET_FETCH, 8, alice,
                                             **fetch_fields(8, "g", None)), 8),
                fetch_u=fetched(await call(node.groups, ApiKey.OFFSET_FETCH, 8, alice,
                                           **fetch_fields(8, "g", {"u": [0]})), 8),
                bob_join=await call(node.groups, ApiKey.JOIN_GROUP, 5, bob, group_id="g", session_timeout=1000,
                                    rebalance_timeout=1000, member_id="", protocol_type="consumer", protocols=()),
                bob_fetch=await call(node.groups, ApiKey.OFFSET_FETCH, 1, bob, **fetch_fields(1, "g", {"t": [0]})),
                bob_find=await call(node.groups, ApiKey.FIND_COORDINATOR, 3, bob, key="g", key_type=0),
                bob_list=await call(node.groups, ApiKey.LIST_GROUPS, 3, bob),
                alice_list=await call(node.groups, ApiKey.LIST_GROUPS, 3, alice),
                bob_describe=await call(node.groups, ApiKey.DESCRIBE_GROUPS, 5, bob, groups=("g",),
                                        include_authorized_operations=True),
                alice_describe=await call(node.groups, ApiKey.DESCRIBE_GROUPS, 5, alice, groups=("g",),
                                          include_authorized_operations=True),
            )
            await node.groups.stop()
            return answers

        a = asyncio.run(scenario())
    finally:
        node.close()
    assert a["commit"] == {0: ErrorCode.none, ("u", 0): ErrorCode.topic_authorization_failed}
    assert a["fetch_all"] == {("t", 0): (11, ErrorCode.none)}, "topics alice may not read are left out"
    assert a["fetch_u"] == {("u", 0): (-1, ErrorCode.topic_authorization_failed)}
    assert a["bob_join"].error_code == ErrorCode.group_authorization_failed
    assert fetched(a["bob_fetch"], 1) == {("t", 0): (-1, ErrorCode.group_authorization_failed)}
    assert a["bob_find"].error_code == ErrorCode.group_authorization_failed
    assert a["bob_list"].groups == () and [g.group_id for g in a["alice_list"].groups] == ["g"]
    assert a["bob_describe"].groups[0].error_code == ErrorCode.group_authorization_failed
    assert a["alice_describe"].groups[0].authorized_operations == (1 << 3) | (1 << 8), "Read implies Describe"
    assert group_offsets(zk, "g", "u", [0]) == {}


def test_with_zookeeper_away_group_requests_answer_coordinator_not_available_and_recover(zookeeper, zk_connect):
    """The coordinator's link to ZooKeeper cut: commits, a new group's join and the
    listing are answered COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR (clients retry,
    then find the coordinator again), never left unanswered; once ZooKeeper is back
    (and the broker the controller again) a member joins and commits."""
    host, port = zookeeper.connect_string.split(",")[0].rsplit(":", 1)
    with TcpProxy((host, int(port))) as proxy:
        node = Node(proxy.address + zk_connect[zk_connect.index("/"):], 1, zk_timeout=3,
                    settings=dataclasses.replace(FAST, zookeeper_timeout=1.0))
        try:
            node.become_controller()
            node.registry.create_topic("t", 2)

            async def scenario():
                await node.groups.start()
                member = Consumer(node.groups, "g", 2)
                await member.join()
                assert await member.commit("t", {0: 10}) == {0: ErrorCode.none}
                proxy.cut()
                away = dict(
                    commit=(await member.commit("t", {0: 20}))[0],
                    join=(await call(node.groups, ApiKey.JOIN_GROUP, 5, group_id="h", session_timeout=ms(1000),
                                     rebalance_timeout=ms(1000), member_id="", protocol_type="consumer",
                                     protocols=(nested(ApiKey.JOIN_GROUP, 5, "JoinGroupRequestProtocol",
                                                       name="range", metadata=b""),))).error_code,
                    fetch=(await call(node.groups, ApiKey.OFFSET_FETCH, 5,
                                      **fetch_fields(5, "g", {"t": [0]}))).error_code,
                )
                proxy.restore()
                await asyncio.to_thread(wait_until, lambda: node.zk.connected, 30, "ZooKeeper again")
                if claim_controller_node(node.zk, 1) is not None and \
                        GroupStore(node.zk, 1).coordinator().epoch_version is None:
                    bump_controller_epoch(node.zk)  # our session was lost: the controller's takeover
                back = Consumer(node.groups, "g", 2)
                while True:  # as a client, rejoin until the coordinator serves again
                    try:
                        await back.join()
                        break
                    except AssertionError:
                        back.member_id = ""
                        await asyncio.sleep(0.1)
                recovered = await back.commit("t", {1: 30})
                await node.groups.stop()
                return away, recovered

            away, recovered = asyncio.run(asyncio.wait_for(scenario(), 60))
        finally:
            node.close_quietly()
    unavailable = {ErrorCode.coordinator_not_available, ErrorCode.not_coordinator}
    assert away["commit"] in unavailable and away["join"] in unavailable and away["fetch"] in unavailable, away
    assert recovered == {1: ErrorCode.none}
