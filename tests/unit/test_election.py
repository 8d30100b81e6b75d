"""The controller's decisions (broker.server.election) and replica placement, as pure functions."""

import pytest

from broker.common.errors import InvalidReplicationFactor
from broker.common.zklayout import PartitionState, assign_round_robin
from broker.server.election import OFFLINE, bounced, elect, imbalanced, prefer, registered_after


def state(leader, epoch, isr):
    return PartitionState(leader=leader, leader_epoch=epoch, isr=list(isr), controller_epoch=1)


REPLICAS = [2, 0, 1]


def test_a_live_leader_with_a_live_isr_is_left_alone():
    assert elect(state(2, 3, [2, 0, 1]), REPLICAS, {0, 1, 2}, False, 5) is None


def test_a_dead_follower_leaves_the_isr_and_the_epoch_stays():
    new = elect(state(2, 3, [2, 0, 1]), REPLICAS, {1, 2}, False, 5).state
    assert (new.leader, new.leader_epoch, new.isr, new.controller_epoch) == (2, 3, [2, 1], 5)


def test_a_dead_leader_is_replaced_by_the_first_live_isr_member_in_replica_order():
    election = elect(state(2, 3, [1, 2, 0]), REPLICAS, {0, 1}, False, 5)
    assert not election.unclean
    assert (election.state.leader, election.state.leader_epoch, election.state.isr) == (0, 4, [1, 0])


def test_a_replica_outside_the_isr_does_not_lead_when_unclean_election_is_off():
    election = elect(state(2, 3, [2, 0]), REPLICAS, {1}, False, 5)
    assert (election.state.leader, election.state.leader_epoch, election.state.isr) == (OFFLINE, 4, [2, 0])
    assert elect(election.state, REPLICAS, {1}, False, 5) is None  # stays offline, no rewrite


def test_an_offline_partition_comes_back_with_the_first_isr_member_to_return():
    offline = state(OFFLINE, 4, [2, 0])
    assert elect(offline, REPLICAS, {1}, False, 5) is None
    new = elect(offline, REPLICAS, {0, 1}, False, 5).state
    assert (new.leader, new.leader_epoch, new.isr) == (0, 5, [0])


def test_unclean_election_picks_a_live_out_of_sync_replica_and_says_so():
    election = elect(state(2, 3, [2, 0]), REPLICAS, {1}, True, 5)
    assert election.unclean
    assert (election.state.leader, election.state.leader_epoch, election.state.isr) == (1, 4, [1])
    assert elect(state(OFFLINE, 4, [2]), REPLICAS, {1}, True, 5).state.leader == 1


def test_with_no_live_replica_at_all_even_unclean_election_goes_offline():
    new = elect(state(2, 3, [2]), REPLICAS, set(), True, 5).state
    assert (new.leader, new.isr) == (OFFLINE, [2])


def test_a_single_replica_partition_is_left_to_its_broker():
    assert elect(state(0, 0, [0]), [0], {1, 2}, False, 1) is None
    assert elect(state(0, 0, [0]), [0], {1, 2}, True, 1) is None


def test_bounced_brokers_are_those_registered_by_a_new_session():
    assert bounced({0: 10, 1: 11, 2: 12}, {0: 10, 1: 20, 3: 30}) == {1}


# ---------------------------------------------------------------- replica placement


@pytest.mark.parametrize("brokers", [1, 2, 3, 5])
@pytest.mark.parametrize("factor", [1, 2, 3])
def test_replicas_are_distinct_brokers_and_leaders_spread(brokers, factor):
    if factor > brokers:
        return
    ids = list(range(10, 10 + brokers))
    assignment = assign_round_robin("events", 4 * brokers, ids, factor)
    for replicas in assignment.values():
        assert len(replicas) == factor and len(set(replicas)) == factor and set(replicas) <= set(ids)
    leaders = [r[0] for r in assignment.values()]
    assert all(leaders.count(b) == 4 for b in ids)
    if factor > 1 and brokers > 2:  # a broker's followers are not all on one other broker
        followers_of_first = {r[1] for r in assignment.values() if r[0] == ids[0]}
        assert len(followers_of_first) > 1


def test_a_replication_factor_of_one_places_exactly_as_before():
    assert assign_round_robin("clicks", 4, [2, 0, 1], 1) == assign_round_robin("clicks", 4, [2, 0, 1])
    assert all(len(r) == 1 for r in assign_round_robin("clicks", 4, [2, 0, 1]).values())


def test_more_replicas_than_brokers_is_refused():
    with pytest.raises(InvalidReplicationFactor, match="replication factor 4"):
        assign_round_robin("clicks", 1, [0, 1, 2], 4)
    with pytest.raises(InvalidReplicationFactor):
        assign_round_robin("clicks", 1, [0, 1, 2], 0)


def test_brokers_registered_after_a_state_write_are_found_without_an_earlier_snapshot():
    # what a controller that has just taken over knows: registrations and the node's last write
    assert registered_after({0: 10, 1: 25, 2: 31}, written_zxid=24) == {1, 2}
    assert registered_after({0: 10}, written_zxid=24) == set()


def test_the_preferred_replica_takes_its_leadership_back_only_when_live_and_in_sync():
    moved = PartitionState(1, 4, [1, 2, 0], controller_epoch=2)
    back = prefer(moved, [0, 1, 2], {0, 1, 2}, controller_epoch=3)
    assert back.state == PartitionState(0, 5, [1, 2, 0], controller_epoch=3) and not back.unclean
    assert prefer(moved, [0, 1, 2], {1, 2}, 3) is None  # preferred replica dead
    assert prefer(PartitionState(1, 4, [1, 2]), [0, 1, 2], {0, 1, 2}, 3) is None  # not caught up
    assert prefer(PartitionState(0, 4, [0, 1]), [0, 1, 2], {0, 1, 2}, 3) is None  # already balanced
    assert prefer(PartitionState(OFFLINE, 4, [0]), [0, 1], {0, 1}, 3) is None  # offline: elect()'s case
    assert prefer(PartitionState(0, 0, [0]), [0], {0}, 3) is None


def test_only_brokers_above_the_imbalance_percentage_get_their_leaderships_back():
    # broker 0 is preferred for 10 partitions and leads 9; broker 1 preferred for 10, leads 8
    pairs = [(0, 0)] * 9 + [(0, 2)] + [(1, 1)] * 8 + [(1, 2)] * 2 + [(2, 2)] * 5
    assert imbalanced(pairs, 10) == {1}  # 10% is not above 10%; 20% is
    assert imbalanced(pairs, 0) == {0, 1}  # any partition led elsewhere
    assert imbalanced(pairs, 20) == set()
    assert imbalanced([(0, OFFLINE)], 10) == {0}  # an offline partition is not led by its preferred replica
    assert imbalanced([], 10) == set()
