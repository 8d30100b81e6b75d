from broker.client.rebalance import assign_ranges, assignment_for, stream_id, streams_of


def test_ranges_are_contiguous_and_cover_every_partition():
    ranges = assign_ranges(list(range(8)), ["a", "b", "c"])
    assert ranges == {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}


def test_more_streams_than_partitions_leaves_streams_idle():
    assert assign_ranges([0, 1], ["a", "b", "c"]) == {"a": [0], "b": [1], "c": []}


def test_assignment_does_not_depend_on_input_order():
    assert assign_ranges([3, 1, 2, 0], ["b", "a"]) == assign_ranges([0, 1, 2, 3], ["a", "b"])


def test_every_consumer_computes_a_disjoint_share_of_the_same_split():
    subscriptions = {"c1": {"t": 2}, "c2": {"t": 1}, "c3": {"t": 1, "u": 1}}
    partitions = {"t": list(range(8)), "u": [0, 1]}
    shares = [assignment_for(c, subscriptions, partitions) for c in subscriptions]
    owned = [key for share in shares for key in share]
    assert sorted(owned) == sorted([("t", p) for p in range(8)] + [("u", 0), ("u", 1)])
    assert len(owned) == len(set(owned))


def test_streams_of_a_topic_are_the_sorted_ids_of_all_subscribers():
    subscriptions = {"b": {"t": 1}, "a": {"t": 2}, "c": {"u": 1}}
    assert streams_of(subscriptions, "t") == [stream_id("a", "t", 0), stream_id("a", "t", 1), stream_id("b", "t", 0)]


def test_unknown_topic_gives_no_partitions():
    assert assignment_for("a", {"a": {"t": 1}}, {}) == {}
