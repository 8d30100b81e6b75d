"""How many messages — so how many offsets — entries hold (docs/architecture.md,
"Offsets"): message i of the entry at position P has offset P + i, so an index of a
segment and a count of the records between two offsets (lag in records) need each
entry's count, which a producer batch carries in its header and a compressed set
only inside."""

from __future__ import annotations

from typing import Callable

from broker.common.compression import DEFAULT_MAX_DECOMPRESSED
from broker.common.message import (
    HEADER, HEADER_SIZE, MAGIC_BATCH, MAGIC_KAFKA, MIN_ENTRY_SIZE, SIZE_FIELD, batch_identity, inner_set, scan,
)


def entry_records(buf: bytes | memoryview, pos: int = 0, max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED) -> int:
    """The messages the valid entry at `pos` holds, so the offsets it takes: 1 for a
    plain entry, a producer or Kafka batch's count field (recordsCount: a Kafka batch
    is never opened here), a compressed set's inner entries
    (decompressed: only the writer's validation and an index build pay for it)."""
    size, magic, attributes = HEADER.unpack_from(buf, pos)[:3]
    if magic == MAGIC_BATCH or magic == MAGIC_KAFKA:
        return batch_identity(buf, pos).count
    if not attributes:
        return 1
    with memoryview(buf) as view:
        return scan(inner_set(view, pos, pos + SIZE_FIELD + size, max_decompressed_bytes)[0]).count


def count_records(buf: bytes | memoryview, per_entry: Callable[[bytes | memoryview, int], int] = entry_records) -> int:
    """The messages in the whole entries at the front of `buf` (already validated),
    each entry counted by `per_entry` (the broker's index counts an unopenable set as
    none: `broker.server.log.index.readable_records`)."""
    records, pos, end = 0, 0, len(buf)
    while end - pos >= HEADER_SIZE:
        size = HEADER.unpack_from(buf, pos)[0]
        if size < MIN_ENTRY_SIZE or pos + SIZE_FIELD + size > end:
            break
        records += per_entry(buf, pos)
        pos += SIZE_FIELD + size
    return records
