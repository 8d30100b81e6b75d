"""Choosing a partition for a message (docs/clients.md, "Producer").

A key always maps to the same partition — from every process, every run, every
language that implements CRC-32 — so consumers see all messages of a key in order.
Python's `hash` is randomized per process and must never be used here.
"""

from __future__ import annotations

import random
import zlib


def partition_for_key(key: bytes, partitions: int) -> int:
    """CRC-32 (zlib) of the key modulo the partition count."""
    return (zlib.crc32(key) & 0x7FFFFFFF) % partitions


def choose_partition(
    key: bytes | None, leaders: dict[int, int], avoid: int | None = None, rng: random.Random = random._inst
) -> int | None:
    """The partition for a message: by key over *all* partitions (a key must not move
    when a broker dies), else at random among available ones, preferring not `avoid`
    (the partition that just failed). None when no partition is available."""
    if key is not None:
        return partition_for_key(key, len(leaders))
    live = [p for p, leader in leaders.items() if leader >= 0]
    if avoid is not None and len(live) > 1 and avoid in live:
        live.remove(avoid)
    if not live:
        return None
    return live[rng.randrange(len(live))] if len(live) > 1 else live[0]
