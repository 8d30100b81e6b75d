"""The monitoring-event counter and the reader's rules, on events built by the counter."""

import json
import random
from types import SimpleNamespace

from broker.client.monitoring import MonitoringCounter
import pytest

from broker.client.monitoring import latest_events, sum_by_source, sum_counts


def message(ts, value=b"abc", key=None):
    return SimpleNamespace(key=key, value=value, timestamp=ts)


def test_counts_are_per_window_of_message_timestamp():
    counter = MonitoringCounter("p1", window_ms=1000)
    counter.record("t", [message(0), message(999), message(1000, b"12345", b"k")])
    events = [json.loads(v) for _, v in counter.events()]
    assert [(e["window_start"], e["window_end"], e["count"], e["bytes"]) for e in events] == [
        (0, 1000, 2, 6), (1000, 2000, 1, 6)]


def test_events_are_cumulative_and_only_for_changed_windows():
    counter = MonitoringCounter("p1", window_ms=1000)
    counter.record("t", [message(10)])
    counter.events()
    counter.record("t", [message(20)])
    assert [json.loads(v)["count"] for _, v in counter.events()] == [2]
    assert counter.events() == []


@pytest.mark.parametrize("seed", range(30))
def test_a_batch_counts_as_its_messages_one_by_one_within_a_window_and_across_windows(seed):
    """`record_batch` (the producer's sender: a batch's timestamps and key-and-value
    bytes) gives the same windows as `record` of each message, whether the batch's
    timestamps fall in one window (counted without a step a message), straddle a
    boundary, or come out of order (a caller's own timestamps)."""
    rng = random.Random(seed)
    base = rng.choice([0, 999, 1000, 5_000_000])
    triples = [(rng.choice([None, b"", b"key"]), rng.randbytes(rng.randrange(0, 30)),
                base + rng.choice([0, 1, rng.randrange(-1500, 1500)] if seed % 3 else [0, 1]))
               for _ in range(rng.randrange(1, 60))]
    one_by_one, batched = MonitoringCounter("p", window_ms=1000), MonitoringCounter("p", window_ms=1000)
    one_by_one.record("t", [message(ts, value, key) for key, value, ts in triples])
    batched.record_batch("t", [ts for _, _, ts in triples],
                         sum(len(value) + len(key or b"") for key, value, _ in triples), lambda: iter(triples))
    assert batched.counts() == one_by_one.counts()
    batched.record_batch("t", [], 0, lambda: iter(()))
    assert batched.counts() == one_by_one.counts()


def test_monitoring_topic_is_never_counted():
    counter = MonitoringCounter("p1", monitoring_topic="_audit")
    counter.record("_audit", [message(1)])
    counter.record_batch("_audit", [1], 3, lambda: iter([(None, b"abc", 1)]))
    assert counter.events() == []


def test_reader_keeps_the_latest_event_per_producer_and_window():
    a = MonitoringCounter("p1", window_ms=1000)
    b = MonitoringCounter("p2", window_ms=1000)
    events = []
    for counter, n in ((a, 3), (b, 2)):
        counter.record("t", [message(5)] * n)
        events += [json.loads(v) for _, v in counter.events()]
        counter.record("t", [message(5)])
        events += [json.loads(v) for _, v in counter.events()]
    events.reverse()  # order of reading does not matter
    assert len(latest_events(events)) == 2
    assert sum_counts(events)[("t", 0)].count == 7


def test_a_mirror_counter_stamps_tier_and_source_on_each_event():
    counter = MonitoringCounter("m1", window_ms=1000, tier="mirror", source="dc-east")
    counter.record("t", [message(5)])
    (event,) = [json.loads(v) for _, v in counter.events()]
    assert (event["tier"], event["source"], event["count"]) == ("mirror", "dc-east", 1)
    with pytest.raises(ValueError, match="source"):
        MonitoringCounter("m2", tier="mirror")


def test_tiers_and_sources_are_summed_apart():
    """One window counted by two producers, a mirror from each of two sources, and the
    same mirror id on both sources: the latest event per (tier, source, producer_id,
    topic, window) counts once, and no tier's count leaks into another's."""
    events = []
    for counter, n in ((MonitoringCounter("p1", window_ms=1000), 4), (MonitoringCounter("p2", window_ms=1000), 3),
                       (MonitoringCounter("m", window_ms=1000, tier="mirror", source="east"), 4),
                       (MonitoringCounter("m", window_ms=1000, tier="mirror", source="west"), 2)):
        for _ in range(n):  # cumulative: every event repeats the earlier counts
            counter.record("t", [message(5)])
            events += [json.loads(v) for _, v in counter.events()]
    assert len(latest_events(events)) == 4
    assert sum_counts(events)[("t", 0)].count == 7
    assert sum_counts(events, "mirror")[("t", 0)].count == 6
    assert {s: c[("t", 0)].count for s, c in sum_by_source(events, "mirror").items()} == {"east": 4, "west": 2}
    assert sum_by_source(events, "producer").keys() == {None}
