"""Exact byte ranges of a partition (docs/clients.md, "Offsets and byte ranges"): what
the provider's load reads.

`read_range(pool, topic, partition, start, end)` yields whole message sets covering
[start, end) — (base offset, bytes) with complete entries only — and stops exactly at
`end`, which must be a message boundary. The sets are passed on undecoded (the Spark
decoder checks CRCs), so the walk cuts by the entries' size fields
(`broker.common.message.whole_entries`). Fetches go to the leader through the connection
pool, which follows a leader change; a leader that is down fails with a
`ConnectionError` naming the partition and the broker.

`walk_range` is the walk itself over any fetch function, `boundary_at_or_before` the
cut that lets a per-run byte cap end a range between messages.
"""

from __future__ import annotations

from typing import Callable, Iterator

from broker.client.cluster import ConnectionPool
from broker.common.errors import LogbusError
from broker.common.message import CorruptEntry, first_entry_size, whole_entries
from broker.common.protocol import FetchResponse

DEFAULT_FETCH_BYTES = 8 << 20

Fetch = Callable[[int, int], FetchResponse]  # (offset, max_bytes) -> the leader's answer


def walk_range(fetch: Fetch, where: str, start: int, end: int,
               fetch_bytes: int = DEFAULT_FETCH_BYTES) -> Iterator[tuple[int, bytes]]:
    """(base_offset, whole entries) covering [start, end) from fetches of at most
    `fetch_bytes`; a message larger than that is fetched whole with one larger fetch.
    `where` ("topic-partition") names the partition in errors."""
    offset = start
    while offset < end:
        fetched = fetch(offset, min(fetch_bytes, end - offset))
        buf = fetched.messages
        if 0 <= fetched.set_offset != offset:  # -1: a version-0 answer, at the offset asked for
            raise LogbusError(f"{where}: range start {offset} is inside an entry (it starts at {fetched.set_offset}): "
                              f"ranges start and end at entry boundaries")
        whole = whole_entries(buf)
        if whole:
            yield offset, bytes(buf[:whole]) if whole < len(buf) else bytes(buf)
            offset += whole
            continue
        needed = first_entry_size(buf)
        if needed is None:
            raise LogbusError(f"{where}: no data at offset {offset} though the range ends at {end} "
                              f"(high watermark {fetched.high_watermark})")
        if needed <= len(buf):  # a complete entry that is not whole: its size is impossible
            raise CorruptEntry(offset, needed, f"impossible size {needed} in {where}")
        if offset + needed > end:  # growing the fetch cannot help
            raise LogbusError(f"{where}: range end {end} is not a message boundary: the message at "
                              f"{offset} ends at {offset + needed}")
        fetch_bytes = max(fetch_bytes, needed)


def read_range(pool: ConnectionPool, topic: str, partition: int, start: int, end: int,
               fetch_bytes: int = DEFAULT_FETCH_BYTES) -> Iterator[tuple[int, bytes]]:
    """Whole message sets of `topic`-`partition` covering [start, end), read at its leader."""

    def fetch(offset: int, max_bytes: int) -> FetchResponse:
        return pool.call_leader(topic, partition, lambda conn: conn.fetch(topic, partition, offset, max_bytes))

    return walk_range(fetch, f"{topic}-{partition}", start, end, fetch_bytes)


def last_boundary(buf: bytes | memoryview, start: int) -> int:
    """The last entry boundary within `buf` read at `start`, or the end of its first
    entry if even that one is not whole (a range holds at least one message)."""
    whole = whole_entries(buf)
    if whole:
        return start + whole
    needed = first_entry_size(buf)
    return start + needed if needed is not None and needed > len(buf) else start


def boundary_at_or_before(pool: ConnectionPool, topic: str, partition: int, start: int, limit: int) -> int:
    """The last message boundary in (start, start+limit] (at least one whole message):
    lets a per-run byte cap end a range between messages."""
    fetched = pool.call_leader(topic, partition, lambda conn: conn.fetch(topic, partition, start, limit))
    return last_boundary(fetched.messages, start)
