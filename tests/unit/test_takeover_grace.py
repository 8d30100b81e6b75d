"""The controller's grace after a takeover (broker.server.controller.TakeoverGrace): which
registrations it distrusts, for how long, and when it wakes the controller to decide
the partitions it held back. The scenario with real brokers is
tests/replication/test_controller.py::test_a_leader_back_first_waits_out_the_lingering_sessions_of_the_dead."""

import pytest

from broker.server.controller import TakeoverGrace


@pytest.fixture
def clock():
    return [1000.0]


def grace_on(clock, session_timeout, controller=7):
    return TakeoverGrace(session_timeout, controller, clock=lambda: clock[0])


def test_registrations_older_than_the_takeover_are_distrusted_for_twice_the_session_timeout(clock):
    grace = grace_on(clock, 6.0)
    grace.begin(controller_czxid=100)
    live = {0: 40, 1: 99, 2: 101}  # broker id -> czxid of its registration
    assert grace.may_be_lingering(live, 0) and grace.may_be_lingering(live, 1)
    assert not grace.may_be_lingering(live, 2)  # registered after the takeover: live for sure
    clock[0] += 11.9
    assert grace.may_be_lingering(live, 0)
    clock[0] += 0.2
    assert not grace.may_be_lingering(live, 0)  # any dead broker's session has expired by now


def test_the_controllers_own_registration_is_never_distrusted(clock):
    """It registered before it took over, but its own session is live: a restarted
    leader's partition goes to it at once (CI saw a four-second wait for it)."""
    grace = grace_on(clock, 2.0, controller=0)
    grace.begin(controller_czxid=100)
    live = {0: 90, 1: 95}
    assert not grace.may_be_lingering(live, 0)
    assert grace.may_be_lingering(live, 1)


def test_a_deferred_partition_wakes_the_controller_when_the_grace_ends(clock):
    grace = grace_on(clock, 3.0)
    grace.begin(controller_czxid=100)
    assert grace.until_over() is None  # nothing held back: no extra wake
    clock[0] += 2.0
    grace.defer("clicks", 0, leader=2, successor=0)
    grace.defer("clicks", 0, leader=2, successor=0)  # the next pass: still held back, logged once
    assert grace.until_over() == pytest.approx(4.0)
    grace.decided("clicks", 0)
    assert grace.until_over() is None
    grace.defer("gone", 0, leader=2, successor=0)  # its topic is deleted: never decided
    clock[0] += 4.0
    assert grace.until_over() is None  # the grace is over: no wake owed, no busy loop


def test_a_new_takeover_starts_a_new_grace_and_forgets_the_old_deferrals(clock):
    grace = grace_on(clock, 3.0)
    grace.begin(controller_czxid=100)
    grace.defer("clicks", 0, leader=2, successor=0)
    clock[0] += 60.0
    grace.begin(controller_czxid=500)
    assert grace.until_over() is None
    assert grace.may_be_lingering({0: 400}, 0)
