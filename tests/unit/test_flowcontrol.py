"""The byte budgets behind back-pressure, as pure bookkeeping."""

from broker.server.flowcontrol import ConnectionLimits, RequestPool


def test_frames_are_admitted_while_they_fit():
    pool = RequestPool(100)
    assert pool.try_reserve("a", 60, lambda: None)
    assert pool.try_reserve("b", 40, lambda: None)
    assert not pool.over


def test_a_frame_that_would_pass_the_bound_waits_until_release():
    pool = RequestPool(100)
    woken = []
    assert pool.try_reserve("a", 60, lambda: None)
    assert not pool.try_reserve("b", 50, lambda: woken.append("b"))
    assert pool.reserved == 60 and pool.waiting == 1
    pool.release(60)
    assert woken == ["b"]
    assert pool.try_reserve("b", 50, lambda: None)
    assert pool.waiting == 0


def test_a_frame_larger_than_the_bound_is_admitted_alone():
    pool = RequestPool(100)
    assert pool.try_reserve("a", 500, lambda: None)
    assert pool.over
    assert not pool.try_reserve("b", 1, lambda: None)


def test_waiters_are_served_in_order():
    pool = RequestPool(100)
    assert pool.try_reserve("a", 90, lambda: None)
    assert not pool.try_reserve("b", 50, lambda: None)
    assert not pool.try_reserve("c", 5, lambda: None)  # would fit, but b waits first
    pool.release(90)
    assert not pool.try_reserve("c", 5, lambda: None)
    assert pool.try_reserve("b", 50, lambda: None)
    assert pool.try_reserve("c", 5, lambda: None)


def test_unsent_answers_count_and_are_forgotten_with_their_connection():
    pool = RequestPool(100)
    pool.set_unsent("a", 80)
    pool.set_unsent("b", 30)
    assert pool.unsent == 110 and pool.over
    pool.set_unsent("a", 10)
    assert pool.unsent == 40 and not pool.over
    pool.forget("b")
    assert pool.unsent == 10


def test_a_departed_waiter_passes_its_turn_on():
    pool = RequestPool(100)
    woken = []
    assert pool.try_reserve("a", 90, lambda: None)
    assert not pool.try_reserve("b", 50, lambda: woken.append("b"))
    assert not pool.try_reserve("c", 50, lambda: woken.append("c"))
    pool.forget("b")
    assert woken == ["c"]


def test_connection_stops_reading_at_its_in_flight_and_unsent_bounds():
    limits = ConnectionLimits(max_in_flight=10, max_unsent=1000)
    assert limits.may_read(9, 999, False, False)
    assert not limits.may_read(10, 0, False, False)
    assert not limits.may_read(0, 1000, False, False)
    assert not limits.may_read(0, 0, False, True)


def test_over_the_broker_wide_bound_only_connections_holding_answers_stop():
    limits = ConnectionLimits(max_in_flight=10, max_unsent=1000)
    assert not limits.may_read(0, 1, True, False)
    assert limits.may_read(3, 0, True, False)
