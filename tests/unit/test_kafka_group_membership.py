"""The Kafka group coordinator's membership protocol (docs/kafka.md, "Consumer groups"),
driven with kio requests against a real ZooKeeper: MEMBER_ID_REQUIRED, a three-member
group losing one member to session expiry, leaving, the coordinator role, and every
refusal a clear error code."""

from __future__ import annotations

import asyncio
import json

import pytest
from kio.schema.errors import ErrorCode

from broker.common.kafka.apis import ApiKey
from broker.server.controllernode import bump_controller_epoch, claim_controller_node
from tests.unit.kafka_group_support import Consumer, Node, call, ms, nested, session


@pytest.fixture
def coordinator(zk_connect):
    node = Node(zk_connect, 1)
    node.become_controller()
    node.registry.create_topic("t", 6)
    yield node
    node.close()


def join_fields(version: int, group: str = "g", member_id: str = "", session_ms: int = 1000,
                protocol_type: str = "consumer", protocols: tuple[str, ...] = ("range",)) -> dict:
    return dict(group_id=group, session_timeout=ms(session_ms), rebalance_timeout=ms(5000), member_id=member_id,
                protocol_type=protocol_type, protocols=tuple(
                    nested(ApiKey.JOIN_GROUP, version, "JoinGroupRequestProtocol", name=n, metadata=n.encode())
                    for n in protocols))


def test_a_first_join_from_v4_gets_member_id_required_and_joins_with_that_id(coordinator):
    async def scenario():
        await coordinator.groups.start()
        first = await call(coordinator.groups, ApiKey.JOIN_GROUP, 9, **join_fields(9))
        assert first.error_code == ErrorCode.member_id_required and first.member_id
        joined = await call(coordinator.groups, ApiKey.JOIN_GROUP, 9, **join_fields(9, member_id=first.member_id))
        old = await call(coordinator.groups, ApiKey.JOIN_GROUP, 3, **join_fields(3, group="h"))
        await coordinator.groups.stop()
        return first, joined, old

    first, joined, old = asyncio.run(scenario())
    assert joined.error_code == ErrorCode.none
    assert (joined.member_id, joined.leader) == (first.member_id, first.member_id)
    assert joined.generation_id == 1 and joined.protocol_name == "range"
    assert [m.member_id for m in joined.members] == [first.member_id]
    assert old.error_code == ErrorCode.none and old.member_id, "v3 and before join at once"


def test_three_members_one_stops_heartbeating_and_the_others_take_its_partitions(coordinator):
    async def scenario():
        await coordinator.groups.start()
        members = [Consumer(coordinator.groups, "g", 6) for _ in range(3)]
        await asyncio.gather(*(m.join() for m in members))
        while len({m.generation for m in members}) > 1 or sum(len(m.assigned) for m in members) != 6 \
                or not all(m.assigned for m in members):
            await asyncio.gather(*(m.join() for m in members))  # a join that came late made a new generation
        before = {m.member_id: list(m.assigned) for m in members}
        generation = members[0].generation
        alive = [asyncio.create_task(m.keep_alive()) for m in members[:2]]  # the third goes silent
        while members[0].generation == generation or members[1].generation != members[0].generation:
            await asyncio.sleep(0.05)
        for task in alive:
            task.cancel()
        stale = await members[2].heartbeat()
        await coordinator.groups.stop()
        return before, members, generation, stale

    before, members, generation, stale = asyncio.run(scenario())
    assert all(len(partitions) == 2 for partitions in before.values())
    assert sorted(members[0].assigned + members[1].assigned) == list(range(6)), "the survivors hold every partition"
    assert set(before[members[2].member_id]) <= set(members[0].assigned + members[1].assigned)
    assert members[0].generation > generation
    assert stale == ErrorCode.unknown_member_id, "the expired member is out of the group"


def test_a_member_idle_through_a_rebalance_expires_and_joins_anew(coordinator):
    """A member that sits out a rebalance (it neither heartbeats nor rejoins) is dropped
    at its session timeout, and the rebalance completes without it; its next JoinGroup
    with the old id is UNKNOWN_MEMBER_ID, and it joins anew with a new id, as Kafka's
    clients do (what a late join in a loaded CI run once made the test above meet)."""
    async def scenario():
        await coordinator.groups.start()
        a, b, c = (Consumer(coordinator.groups, "g", 6) for _ in range(3))
        await a.join()
        first_id = a.member_id
        await asyncio.gather(b.join(), c.join())
        without_a = sorted(b.assigned + c.assigned)
        await a.join()
        await coordinator.groups.stop()
        return first_id, without_a, a

    first_id, without_a, a = asyncio.run(scenario())
    assert without_a == list(range(6)), "the rebalance completed without the idle member"
    assert a.member_id and a.member_id != first_id, "it joined anew"
    assert a.assigned, "and was given partitions"


def test_leave_group_in_batches_rebalances_the_rest_and_describe_and_list_show_it(coordinator):
    async def scenario():
        await coordinator.groups.start()
        members = [Consumer(coordinator.groups, "g", 6) for _ in range(3)]
        await asyncio.gather(*(m.join() for m in members))
        left = await call(coordinator.groups, ApiKey.LEAVE_GROUP, 5, group_id="g", members=tuple(
            nested(ApiKey.LEAVE_GROUP, 5, "MemberIdentity", member_id=m) for m in (members[1].member_id, "nobody")))
        told = await members[0].heartbeat()
        preparing = await call(coordinator.groups, ApiKey.DESCRIBE_GROUPS, 5, groups=("g", "unknown"),
                               include_authorized_operations=True)
        listed = await call(coordinator.groups, ApiKey.LIST_GROUPS, 4, states_filter=("PreparingRebalance",))
        await asyncio.gather(members[0].join(), members[2].join())
        stable = await call(coordinator.groups, ApiKey.DESCRIBE_GROUPS, 0, groups=("g",))
        await coordinator.groups.stop()
        return members, left, told, preparing, listed, stable

    members, left, told, preparing, listed, stable = asyncio.run(scenario())
    assert [m.error_code for m in left.members] == [ErrorCode.none, ErrorCode.unknown_member_id]
    assert told == ErrorCode.rebalance_in_progress
    g, unknown = preparing.groups
    assert g.group_state == "PreparingRebalance" and unknown.group_state == "Dead"
    assert members[1].member_id not in [m.member_id for m in g.members]
    assert g.authorized_operations == (1 << 3) | (1 << 8), "no authorizer: Read and Describe"
    assert [x.group_id for x in listed.groups] == ["g"]
    (g,) = stable.groups
    assert (g.group_state, g.protocol_type, g.protocol_data) == ("Stable", "consumer", "roundrobin")
    assert sorted(m.member_id for m in g.members) == sorted([members[0].member_id, members[2].member_id])
    assert sorted(json.loads(m.member_assignment) for m in g.members) == [[0, 2, 4], [1, 3, 5]]


def test_a_broker_that_is_not_the_controller_answers_not_coordinator_and_finds_it(coordinator, zk_connect):
    other = Node(zk_connect, 2)
    try:
        async def scenario():
            await other.groups.start()
            join = await call(other.groups, ApiKey.JOIN_GROUP, 5, **join_fields(5))
            v3 = await call(other.groups, ApiKey.FIND_COORDINATOR, 3, key="g", key_type=0)
            v0 = await call(other.groups, ApiKey.FIND_COORDINATOR, 0, key="g")
            v4 = await call(other.groups, ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=("g", "h"))
            txn = await call(other.groups, ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("tx",))
            listed = await call(other.groups, ApiKey.LIST_GROUPS, 3)
            await other.groups.stop()
            return join, v3, v0, v4, txn, listed

        join, v3, v0, v4, txn, listed = asyncio.run(scenario())
    finally:
        other.close()
    assert join.error_code == ErrorCode.not_coordinator
    assert (v3.error_code, v3.node_id, v3.host, v3.port) == (ErrorCode.none, 1, "127.0.0.1", 9101), \
        "the controller's KAFKA endpoint, the listener the request came in on"
    assert (v0.node_id, v0.port) == (1, 9101)
    assert [(c.key, c.node_id, c.port, c.error_code) for c in v4.coordinators] == \
        [("g", 1, 9101, ErrorCode.none), ("h", 1, 9101, ErrorCode.none)]
    assert txn.coordinators[0].error_code == ErrorCode.invalid_request
    assert "transactions" in txn.coordinators[0].error_message
    assert listed.groups == ()


def test_a_new_controller_coordinates_only_once_it_has_bumped_the_controller_epoch(zk_connect):
    """Between its /controller node and its bump of /controller_epoch, the epoch's
    version is still the deposed coordinator's: writing with it would not fence that
    one, so the new one answers COORDINATOR_LOAD_IN_PROGRESS until the bump."""
    node = Node(zk_connect, 1)
    try:
        bump_controller_epoch(node.zk)  # a predecessor's epoch
        assert claim_controller_node(node.zk, 1) is not None

        async def scenario():
            await node.groups.start()
            before = await call(node.groups, ApiKey.JOIN_GROUP, 5, **join_fields(5))
            bump_controller_epoch(node.zk)
            after = before
            while after.error_code == ErrorCode.coordinator_load_in_progress:  # a client retries
                await asyncio.sleep(0.05)
                after = await call(node.groups, ApiKey.JOIN_GROUP, 5, **join_fields(5))
            await node.groups.stop()
            return before, after

        before, after = asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        node.close()
    assert before.error_code == ErrorCode.coordinator_load_in_progress
    assert after.error_code == ErrorCode.member_id_required


def test_bad_joins_syncs_and_heartbeats_get_clear_error_codes(coordinator):
    async def scenario():
        await coordinator.groups.start()
        member = Consumer(coordinator.groups, "g", 6)
        await member.join()
        answers = {
            "empty group id": await call(coordinator.groups, ApiKey.JOIN_GROUP, 5, **join_fields(5, group="")),
            "session too short": await call(coordinator.groups, ApiKey.JOIN_GROUP, 5,
                                            **join_fields(5, group="x", session_ms=100)),
            "session too long": await call(coordinator.groups, ApiKey.JOIN_GROUP, 5,
                                           **join_fields(5, group="x", session_ms=3_600_000)),
            "other protocol type": await call(coordinator.groups, ApiKey.JOIN_GROUP, 5,
                                              **join_fields(5, protocol_type="connect", protocols=("roundrobin",))),
            "no common protocol": await call(coordinator.groups, ApiKey.JOIN_GROUP, 5,
                                             **join_fields(5, protocols=("sticky",))),
            "no protocol type": await call(coordinator.groups, ApiKey.JOIN_GROUP, 5,
                                           **join_fields(5, group="y", protocol_type="")),
            "unknown member joins": await call(coordinator.groups, ApiKey.JOIN_GROUP, 5,
                                               **join_fields(5, member_id="made-up", protocols=("roundrobin",))),
            "unknown member heartbeat": await call(coordinator.groups, ApiKey.HEARTBEAT, 4, group_id="g",
                                                   generation_id=member.generation, member_id="made-up"),
            "wrong generation heartbeat": await call(coordinator.groups, ApiKey.HEARTBEAT, 4, group_id="g",
                                                     generation_id=member.generation + 5,
                                                     member_id=member.member_id),
            "wrong generation sync": await call(coordinator.groups, ApiKey.SYNC_GROUP, 5, group_id="g",
                                                generation_id=member.generation - 1, member_id=member.member_id,
                                                assignments=()),
            "wrong protocol sync": await call(coordinator.groups, ApiKey.SYNC_GROUP, 5, group_id="g",
                                              generation_id=member.generation, member_id=member.member_id,
                                              protocol_type="consumer", protocol_name="sticky", assignments=()),
            "unknown group leave": await call(coordinator.groups, ApiKey.LEAVE_GROUP, 1, group_id="nope",
                                              member_id="m"),
        }
        await coordinator.groups.stop()
        return answers

    codes = {what: answer.error_code for what, answer in asyncio.run(scenario()).items()}
    assert codes == {
        "empty group id": ErrorCode.invalid_group_id,
        "session too short": ErrorCode.invalid_session_timeout,
        "session too long": ErrorCode.invalid_session_timeout,
        "other protocol type": ErrorCode.inconsistent_group_protocol,
        "no common protocol": ErrorCode.inconsistent_group_protocol,
        "no protocol type": ErrorCode.inconsistent_group_protocol,
        "unknown member joins": ErrorCode.unknown_member_id,
        "unknown member heartbeat": ErrorCode.unknown_member_id,
        "wrong generation heartbeat": ErrorCode.illegal_generation,
        "wrong generation sync": ErrorCode.illegal_generation,
        "wrong protocol sync": ErrorCode.inconsistent_group_protocol,
        "unknown group leave": ErrorCode.unknown_member_id,
    }
