"""The ZooKeeper layout's paths and node codecs (docs/zookeeper.md, a contract)."""

import json

import pytest

from broker.common.errors import UnknownError
from broker.common.protocol import BrokerInfo
from broker.common.topicdeletion import decode_marker, encode_marker, tombstone_path
from broker.common.zklayout import (
    assign_round_robin, broker_path, consumer_path, decode_assignment, decode_topic_id, deletion_path, decode_broker, decode_offset,
    decode_subscription, encode_assignment, encode_broker, encode_offset, encode_subscription, group_ids_path,
    offset_path, offsets_path, owner_path, owners_path, topic_path,
)


def test_paths_follow_the_contract():
    assert broker_path(2) == "/brokers/ids/2"
    assert topic_path("clicks") == "/brokers/topics/clicks"
    assert group_ids_path("g") == "/consumers/g/ids"
    assert consumer_path("g", "c1") == "/consumers/g/ids/c1"
    assert owners_path("g") == "/consumers/g/owners"
    assert owner_path("g", "clicks", 3) == "/consumers/g/owners/clicks/3"
    assert offsets_path("g") == "/consumers/g/offsets"
    assert offset_path("g", "clicks", 3) == "/consumers/g/offsets/clicks/3"
    assert deletion_path("clicks") == "/admin/delete_topics/clicks"


def test_assignment_is_json_with_string_partitions_in_order():
    data = encode_assignment({1: [0], 0: [2]})
    assert json.loads(data) == {"partitions": {"0": [2], "1": [0]}}
    assert list(json.loads(data)["partitions"]) == ["0", "1"]
    assert decode_assignment(data) == {0: [2], 1: [0]}
    assert decode_topic_id(data) is None  # a topic from before ids


def test_a_topic_node_carries_its_id_and_a_marker_names_it():
    data = encode_assignment({0: [1]}, "0f" * 16)
    assert json.loads(data) == {"partitions": {"0": [1]}, "topic_id": "0f" * 16}
    assert decode_topic_id(data) == "0f" * 16
    assert json.loads(encode_marker("0f" * 16)) == {"topic_id": "0f" * 16}
    assert decode_marker(encode_marker(None)) is None
    assert tombstone_path("0f" * 16) == "/admin/deleted_topic_ids/" + "0f" * 16


def test_broker_node_round_trips_and_carries_the_version():
    data = encode_broker(BrokerInfo(4, "10.0.0.1", 9092), "0.1.0")
    assert json.loads(data) == {"host": "10.0.0.1", "port": 9092, "version": "0.1.0"}
    assert decode_broker(4, data) == BrokerInfo(4, "10.0.0.1", 9092)


def test_subscription_maps_topics_to_stream_counts():
    assert json.loads(encode_subscription({"a": 2})) == {"a": 2}
    assert decode_subscription(b'{"a": "3"}') == {"a": 3}


def test_offset_is_a_decimal_string():
    assert encode_offset(1234) == b"1234"
    assert decode_offset(b" 1234\n") == 1234
    with pytest.raises(ValueError):
        decode_offset(b"")


def test_round_robin_spreads_partitions_from_a_topic_dependent_start():
    assignment = assign_round_robin("clicks", 4, [2, 0, 1])
    leaders = [replicas[0] for _, replicas in sorted(assignment.items())]
    assert sorted(leaders[:3]) == [0, 1, 2] and leaders[3] == leaders[0]
    assert assign_round_robin("clicks", 4, [0, 1, 2]) == assignment  # order of ids does not matter


def test_round_robin_needs_a_live_broker():
    with pytest.raises(UnknownError, match="no live brokers"):
        assign_round_robin("clicks", 1, [])


def test_partition_state_node_follows_the_contract():
    from broker.common.zklayout import PartitionState, controller_epoch_path, controller_path, partition_state_path

    assert partition_state_path("clicks", 3) == "/brokers/topics/clicks/partitions/3/state"
    assert (controller_path(), controller_epoch_path()) == ("/controller", "/controller_epoch")
    state = PartitionState(2, 4, [2, 0], 1)
    assert json.loads(state.encode()) == {"leader": 2, "leader_epoch": 4, "isr": [2, 0], "controller_epoch": 1, "version": 1}
    assert PartitionState.decode(state.encode()) == state
    assert PartitionState.initial([1, 2, 0]) == PartitionState(1, 0, [1, 2, 0])


def test_replicas_are_distinct_brokers_after_the_leader():
    from broker.common.errors import InvalidReplicationFactor

    assignment = assign_round_robin("t", 6, [0, 1, 2], 3)
    assert all(sorted(r) == [0, 1, 2] for r in assignment.values())
    assert {r[0] for r in assignment.values()} == {0, 1, 2}
    with pytest.raises(InvalidReplicationFactor):
        assign_round_robin("t", 1, [0, 1], 3)
    with pytest.raises(InvalidReplicationFactor):
        assign_round_robin("t", 1, [0, 1], 0)
