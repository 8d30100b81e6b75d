"""A log's ends as Kafka clients count them (docs/kafka.md, "Offsets").

A record's offset is its entry's byte position plus its index in the entry
(docs/architecture.md, "Offsets"), so offsets have gaps, and a log's visible end — a
byte position — lies past its last record's offset + 1 whenever the last entry spans
more bytes than it holds records (always). A Kafka client takes the high watermark and
ListOffsets' latest for "one past the last record": its lag is high watermark − its
position, and it reports the end of a partition when its position reaches the high
watermark. So the Kafka listener answers with the last visible record's offset + 1,
and a fetch there starts at the next entry (`broker.server.log.lookups.covering`).

ListOffsets by time looks for the first record whose timestamp is at or after the time:
the segments' timestamp bounds skip whole segments, then the entries of one segment
are read in order (an entry's header timestamp is the largest of its records', so
most entries are passed over without being opened). Kafka keeps a time index per
segment for this; logbus reads the segment (at most `log.segment.bytes`).
"""

from __future__ import annotations

import bisect

from broker.common.message import HEADER, SIZE_FIELD, iter_messages
from broker.server.log.log import Log
from broker.server.log.lookups import chunks


def kafka_end(log: Log, visible: int | None = None) -> int:
    """The offset after the last visible record (the log's start when it has none)."""
    visible = log.visible_offset if visible is None else visible
    segments = log.segments
    if visible <= segments[0].base_offset:
        return visible
    bases = [s.base_offset for s in segments]
    segment = segments[bisect.bisect_right(bases, visible - 1) - 1]
    position = visible - 1 - segment.base_offset
    start, _, records = segment.index.entry_at(segment.file.fileno(), position)
    return segment.base_offset + start + max(records, 1)


def offset_for_time(log: Log, timestamp: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the first visible record stamped at or after
    `timestamp`; None when every record is older."""
    visible = log.visible_offset
    for segment in log.segments:
        if segment.base_offset >= visible:
            break
        if segment.max_timestamp < timestamp:
            continue
        for offset, data in chunks((segment,), segment.base_offset, min(segment.end_offset, visible)):
            pos = 0
            while pos < len(data):
                size, _, _, _, entry_max = HEADER.unpack_from(data, pos)[:5]
                end = pos + SIZE_FIELD + size
                if entry_max >= timestamp:
                    for message in iter_messages(data[pos:end], offset + pos):
                        if message.timestamp >= timestamp:
                            return message.offset, message.timestamp
                pos = end
    return None
