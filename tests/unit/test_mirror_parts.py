"""The mirror's pure parts (broker/client/mirror_partition.py, the counters of
broker/client/monitoring.py it publishes without waiting): batches rebuilt the same
after a restart, messages placed by partitioning, and monitoring windows due again
when their events were not published or a restarted mirror restores them."""

from __future__ import annotations

import json

from broker.client.mirror_partition import entries, entry_starts, target_batches, target_partition
from broker.client.monitoring import MIRROR_TIER, MonitoringCounter
from broker.client.partitioner import partition_for_key
from broker.common.columns import decode_fetched
from broker.common.message import BatchIdentity, Codec, Message, batch_identity, encode_batch, encode_message_set

WINDOW = 600_000


def message(offset: int, value: bytes, key: bytes | None = None) -> Message:
    return Message(offset=offset, next_offset=offset + 100, key=key, value=value, timestamp=1_000 + offset)


def counter() -> MonitoringCounter:
    return MonitoringCounter("mirror:dc:east:events:0", WINDOW, tier=MIRROR_TIER, source="east")


def test_batches_made_twice_from_the_same_entries_and_sequences_are_the_same_bytes():
    groups = [[message(0, b"a")], [message(100, b"b"), message(101, b"c")]]
    first = target_batches(groups, 7, {0: 5}, lambda m: 0)
    assert first == target_batches(groups, 7, {0: 5}, lambda m: 0)
    batches, sequences = first
    assert [batch_identity(payload).base_sequence for _, payload in batches] == [5, 6]
    assert sequences == {0: 8}


def test_an_entry_split_over_target_partitions_makes_one_batch_per_partition():
    groups = [[message(0, b"x", b"k1"), message(1, b"y", b"k2")]]
    batches, sequences = target_batches(groups, 7, {}, lambda m: 0 if m.key == b"k1" else 1)
    assert [target for target, _ in batches] == [0, 1]
    assert sequences == {0: 1, 1: 1}


def source_set() -> bytes:
    """A producer batch of 4, a gzip set of 3 and a plain entry, as a fetch returns them."""
    return (encode_batch([(None, b"b%d" % i, 1) for i in range(4)], BatchIdentity(9, 0, 0, 4))
            + encode_message_set([(None, b"g%d" % i, 2) for i in range(3)], Codec.GZIP)
            + encode_message_set([(None, b"plain", 3)]))


def test_messages_are_grouped_by_the_source_entry_that_holds_them():
    """Records of a batch or a compressed set have offsets of their own (P, P+1, ...):
    the grouping follows the fetched set's entries, so each source entry is one target
    batch, not one batch per record."""
    data = source_set()
    messages = decode_fetched(data, 1_000, 1_000).messages()
    groups = entries(messages, entry_starts(data, 1_000))
    assert [[m.value for m in group] for group in groups] == [
        [b"b0", b"b1", b"b2", b"b3"], [b"g0", b"g1", b"g2"], [b"plain"]]
    batches, sequences = target_batches(groups, 7, {}, lambda m: 0)
    assert [batch_identity(payload).count for _, payload in batches] == [4, 3, 1]
    assert sequences == {0: 8}


def test_a_fetch_from_a_record_inside_an_entry_groups_the_rest_of_that_entry():
    """A checkpoint at a record inside a source entry (the fetch answers the whole entry
    and its records below are dropped): the rest of the entry is one group."""
    data = source_set()
    resume = decode_fetched(data, 1_000, 1_000).offsets[2]
    groups = entries(decode_fetched(data, 1_000, resume).messages(), entry_starts(data, 1_000))
    assert [[m.value for m in group] for group in groups] == [[b"b2", b"b3"], [b"g0", b"g1", b"g2"], [b"plain"]]
    assert groups[-1][-1].next_offset == 1_000 + len(data)


def test_entry_starts_stop_at_a_partial_entry():
    data = source_set()
    whole = entry_starts(data, 0)
    assert len(whole) == 3
    assert entry_starts(data[:-2], 0) == whole[:2]


def test_messages_go_to_the_same_partition_or_their_keys():
    assert target_partition("same", 3, b"user", 8) == 3
    assert target_partition("key", 3, b"user", 8) == partition_for_key(b"user", 8)
    assert target_partition("key", 3, None, 2) == 1


def test_windows_of_events_not_published_are_due_again():
    counts = counter()
    counts.record("events", [message(0, b"a"), message(100, b"b")])
    events = counts.events()
    assert len(events) == 1 and not counts.pending()
    counts.requeue([key for key, _ in events])
    again = counts.events()
    assert [json.loads(value)["count"] for _, value in again] == [2]
    assert json.loads(again[0][1])["seq"] > json.loads(events[0][1])["seq"]


def test_restored_windows_are_published_again_with_a_higher_seq():
    before = counter()
    before.record("events", [message(0, b"a")])
    restored = counter()
    restored.restore(before.counts(), 10_000)
    assert restored.pending()
    [(_, value)] = restored.events()
    assert json.loads(value)["count"] == 1 and json.loads(value)["seq"] > 10_000
