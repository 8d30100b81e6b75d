"""The provider's range read as a walk over entries (broker.client.ranges), over a
byte buffer standing for a partition: no broker needed for the walk itself."""

import pytest

from broker.client.ranges import last_boundary, walk_range
from broker.common.errors import LogbusError
from broker.common.message import CorruptEntry, encode_message_set, iter_messages, whole_entries
from broker.common.protocol import FetchResponse

ENTRY = 22 + 10  # 10-byte values


def partition(n: int, size: int = 10) -> bytes:
    return encode_message_set([(None, bytes([65 + i % 26]) * size, 1000 + i) for i in range(n)])


def fetcher(data: bytes, calls: list | None = None):
    def fetch(offset: int, max_bytes: int) -> FetchResponse:
        if calls is not None:
            calls.append((offset, max_bytes))
        return FetchResponse(len(data), data[offset : offset + max_bytes])

    return fetch


def test_whole_entries_stops_before_a_partial_tail():
    data = partition(3)
    assert whole_entries(data) == 3 * ENTRY
    assert whole_entries(data[:-1]) == 2 * ENTRY
    assert whole_entries(data[:ENTRY - 1]) == 0
    assert whole_entries(data[:3]) == 0


def test_whole_entries_stops_at_an_impossible_size():
    data = bytearray(partition(3))
    data[ENTRY : ENTRY + 4] = (3).to_bytes(4, "big")
    assert whole_entries(bytes(data)) == ENTRY


def test_walk_cuts_fetches_ending_mid_entry_at_the_last_whole_entry():
    data, calls = partition(10), []
    sets = list(walk_range(fetcher(data, calls), "t-0", 0, len(data), fetch_bytes=3 * ENTRY + 5))
    assert [base for base, _ in sets] == [0, 3 * ENTRY, 6 * ENTRY, 9 * ENTRY]
    assert all(len(buf) % ENTRY == 0 for _, buf in sets)
    assert b"".join(buf for _, buf in sets) == data
    assert calls[1] == (3 * ENTRY, 3 * ENTRY + 5)  # the next fetch starts at the cut tail


def test_walk_stops_exactly_at_the_range_end():
    data = partition(10)
    sets = list(walk_range(fetcher(data), "t-0", 2 * ENTRY, 5 * ENTRY))
    assert sets == [(2 * ENTRY, data[2 * ENTRY : 5 * ENTRY])]
    assert [m.offset for m in iter_messages(sets[0][1], sets[0][0])] == [2 * ENTRY, 3 * ENTRY, 4 * ENTRY]


def test_walk_grows_the_fetch_for_a_message_larger_than_it():
    data = partition(1, size=100) + partition(1)
    sets = list(walk_range(fetcher(data), "t-0", 0, len(data), fetch_bytes=50))
    assert [base for base, _ in sets] == [0, 122]
    assert b"".join(buf for _, buf in sets) == data


def test_walk_refuses_an_end_inside_a_message():
    data = partition(1, size=100)
    with pytest.raises(LogbusError, match="range end 50 is not a message boundary: the message at 0 ends at 122"):
        list(walk_range(fetcher(data), "t-0", 0, 50))


def test_walk_names_the_partition_when_data_is_missing():
    data = partition(2)
    with pytest.raises(LogbusError, match=r"t-3: no data at offset 64 though the range ends at 100 \(high watermark 64"):
        list(walk_range(fetcher(data), "t-3", 0, 100))


def test_walk_refuses_an_entry_of_impossible_size():
    data = (3).to_bytes(4, "big") + bytes(40)
    with pytest.raises(CorruptEntry, match="impossible size"):
        list(walk_range(fetcher(data), "t-0", 0, len(data)))


def test_empty_range_reads_nothing():
    assert list(walk_range(fetcher(partition(2)), "t-0", ENTRY, ENTRY)) == []


def test_last_boundary_keeps_whole_entries_or_at_least_one_message():
    data = partition(3)
    assert last_boundary(data[: 2 * ENTRY + 7], 1000) == 1000 + 2 * ENTRY
    big = partition(1, size=100)
    assert last_boundary(big[:50], 1000) == 1000 + 122
    assert last_boundary(b"", 1000) == 1000
