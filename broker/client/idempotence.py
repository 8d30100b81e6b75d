"""The idempotent producer's identity (docs/clients.md, "Idempotence"): the producer
id the cluster gave it, and per partition the epoch and the next sequence to give a
batch (Kafka's KIP-98, with KIP-360's epoch bump done per partition).

A batch gets its sequence the first time it is sent and keeps it through every
retry, so a broker that already appended it answers with the first append's offsets
instead of appending it again. When a batch of a partition fails for good, or the
partition answers that it lost the producer's earlier batches (OutOfOrderSequence
with nothing earlier outstanding), the partition's epoch goes up and its sequences
start again at 0; batches not yet acknowledged are numbered again at their next send.
Used by the sender thread only."""

from __future__ import annotations

from collections import deque

from broker.client.batch import ProducerBatch
from broker.common.message import SEQUENCE_LIMIT, BatchIdentity

MAX_IN_FLIGHT_PER_PARTITION = 5  # the batches a partition's producer state remembers
# A producer batch is one entry, and the broker refuses entries over message.max.bytes
# (1 MiB by default): batches close (and merge) below half of that.
IDEMPOTENT_BATCH_BYTES = 512 << 10
MAX_EPOCH = (1 << 15) - 1


class ProducerIdentity:
    def __init__(self) -> None:
        self.producer_id: int | None = None
        self._epochs: dict[tuple[str, int], int] = {}
        self._next: dict[tuple[str, int], int] = {}

    def start(self, producer_id: int) -> None:
        """A (new) producer id: every partition starts at epoch 0, sequence 0."""
        self.producer_id = producer_id
        self._epochs.clear()
        self._next.clear()

    def assign(self, batch: ProducerBatch) -> BatchIdentity:
        """The batch's identity: the one it was first sent with, unless its partition
        was reset since; then (and at its first send) the partition's next sequence.
        A sequenced batch stays on its partition."""
        key = (batch.topic, batch.partition)
        epoch = self._epochs.get(key, 0)
        if batch.sequence is None or batch.epoch != epoch or batch.producer_id != self.producer_id:
            batch.sequence = self._next.get(key, 0)
            batch.epoch = epoch
            batch.producer_id = self.producer_id
            self._next[key] = (batch.sequence + batch.count) % SEQUENCE_LIMIT
            batch.movable = False
        return BatchIdentity(self.producer_id, epoch, batch.sequence, batch.count)

    def reset(self, topic: str, partition: int) -> None:
        """Start the partition's sequences again under a new epoch. Past the largest
        epoch, the producer asks for a new id instead (`producer_id` becomes None)."""
        key = (topic, partition)
        epoch = self._epochs.get(key, 0) + 1
        if epoch > MAX_EPOCH:
            self.producer_id = None
            return
        self._epochs[key] = epoch
        self._next[key] = 0


def even_shares(ready: deque[ProducerBatch], slots: int, reach: int) -> dict[tuple[str, int], int]:
    """The bytes each of a partition's `slots` batches of a sender round may grow to, so
    that its ready messages (the first `reach` bytes of the queue) spread evenly over
    them. The pipeline encodes a batch while the broker appends the one before: even
    batches keep both busy, where four small ones and a large last one made them take
    turns (BENCHMARKS.md, issue 38)."""
    totals: dict[tuple[str, int], int] = {}
    taken = 0
    for batch in ready:
        if taken >= reach:
            break
        key = (batch.topic, batch.partition)
        totals[key] = totals.get(key, 0) + batch.bytes
        taken += batch.bytes
    return {key: -(-total // slots) for key, total in totals.items()}
