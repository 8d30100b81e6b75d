import json
from types import SimpleNamespace

from broker.client.audit import AuditCounter
from broker.client.monitoring import latest_events, sum_counts


def message(ts, value=b"abc", key=None):
    return SimpleNamespace(key=key, value=value, timestamp=ts)


def test_counts_are_per_window_of_message_timestamp():
    counter = AuditCounter("p1", window_ms=1000)
    counter.record("t", [message(0), message(999), message(1000, b"12345", b"k")])
    events = [json.loads(v) for _, v in counter.events()]
    assert [(e["window_start"], e["window_end"], e["count"], e["bytes"]) for e in events] == [
        (0, 1000, 2, 6), (1000, 2000, 1, 6)]


def test_events_are_cumulative_and_only_for_changed_windows():
    counter = AuditCounter("p1", window_ms=1000)
    counter.record("t", [message(10)])
    counter.events()
    counter.record("t", [message(20)])
    assert [json.loads(v)["count"] for _, v in counter.events()] == [2]
    assert counter.events() == []


def test_audit_topic_is_never_counted():
    counter = AuditCounter("p1", audit_topic="_audit")
    counter.record("_audit", [message(1)])
    assert counter.events() == []


def test_reader_keeps_the_latest_event_per_producer_and_window():
    a = AuditCounter("p1", window_ms=1000)
    b = AuditCounter("p2", window_ms=1000)
    events = []
    for counter, n in ((a, 3), (b, 2)):
        counter.record("t", [message(5)] * n)
        events += [json.loads(v) for _, v in counter.events()]
        counter.record("t", [message(5)])
        events += [json.loads(v) for _, v in counter.events()]
    events.reverse()  # order of reading does not matter
    assert len(latest_events(events)) == 2
    assert sum_counts(events)[("t", 0)].count == 7
