"""Which consumer stream reads which partition: the paper's Algorithm 1
(docs/clients.md, "Consumer groups").

Pure functions, no ZooKeeper: every consumer of a group computes the same answer from
the same registry contents, so they agree without talking to each other.

For each topic: sort its partitions and the ids of all streams subscribed to it; with
N = partitions // streams, stream i gets the i-th contiguous range (the first
`partitions % streams` streams get one more). A stream id is
`<consumer_id>-<topic>-<i>`; a stream with no range is idle.
"""

from __future__ import annotations

Subscriptions = dict[str, dict[str, int]]  # consumer id -> {topic: number of streams}


def stream_id(consumer_id: str, topic: str, index: int) -> str:
    return f"{consumer_id}-{topic}-{index}"


def streams_of(subscriptions: Subscriptions, topic: str) -> list[str]:
    """Every stream id subscribed to `topic`, sorted: the order all consumers use."""
    return sorted(
        stream_id(consumer, topic, i)
        for consumer, topics in subscriptions.items()
        for i in range(int(topics.get(topic, 0)))
    )


def assign_ranges(partitions: list[int], streams: list[str]) -> dict[str, list[int]]:
    """Stream i of the sorted streams gets the i-th contiguous range of sorted partitions."""
    parts = sorted(partitions)
    ordered = sorted(streams)
    if not ordered:
        return {}
    per, extra = divmod(len(parts), len(ordered))
    out = {}
    for i, stream in enumerate(ordered):
        start = i * per + min(i, extra)
        out[stream] = parts[start : start + per + (1 if i < extra else 0)]
    return out


def assignment_for(consumer_id: str, subscriptions: Subscriptions,
                   partitions: dict[str, list[int]]) -> dict[tuple[str, int], str]:
    """The partitions this consumer must own: {(topic, partition): its stream id}."""
    mine: dict[tuple[str, int], str] = {}
    for topic, count in sorted(subscriptions.get(consumer_id, {}).items()):
        if count <= 0 or topic not in partitions:
            continue
        ours = {stream_id(consumer_id, topic, i) for i in range(count)}
        for stream, parts in assign_ranges(partitions[topic], streams_of(subscriptions, topic)).items():
            if stream in ours:
                for p in parts:
                    mine[(topic, p)] = stream
    return mine
