"""Helpers for client tests: write records that share entries, read a whole topic
back, collect from group streams."""

from __future__ import annotations

import threading

from broker.client.metadata import open_metadata
from broker.client.consumer import SimpleConsumer
from broker.client.errors import ConsumerTimeout
from broker.client.group import ConsumerGroup
from broker.client.producer import Producer
from broker.common.auditcounts import WINDOW_MS
from broker.common.message import Message
from harness.process import wait_until


def produce_batch_and_gzip_set(zk_connect: str, topic: str, count: int = 10) -> None:
    """An idempotent producer's batch of `count` records (`batched-<i>`), then a gzip
    set of `count` (`gzipped-<i>`), on partition 0: records that share an entry, each
    with an offset of its own (docs/architecture.md, "Offsets")."""
    with Producer(zookeeper=zk_connect, monitoring=False, mode="async", linger_ms=200, batch_size=count) as producer:
        for i in range(count):
            producer.send(topic, b"batched-%d" % i, partition=0)
    with Producer(zookeeper=zk_connect, monitoring=False, mode="async", enable_idempotence=False, compression="gzip",
                  linger_ms=200, batch_size=count) as producer:
        for i in range(count):
            producer.send(topic, b"gzipped-%d" % i, partition=0)


def entry_count(messages: list[Message]) -> int:
    """How many entries hold `messages` (one partition, in order): the records of one
    entry have consecutive offsets, the next entry starts past the last one's bytes."""
    return 1 + sum(1 for a, b in zip(messages, messages[1:]) if b.offset > a.offset + 1) if messages else 0


def read_topic(zk_connect: str, topic: str) -> dict[int, list[Message]]:
    """Every visible message of every partition, by partition."""
    metadata = open_metadata(zk_connect)
    try:
        out = {}
        for partition in sorted(metadata.partitions(topic) or {}):
            with SimpleConsumer(topic, partition, metadata=metadata, offset="smallest", max_wait_ms=0) as consumer:
                out[partition] = list(consumer)
        return out
    finally:
        metadata.close()


def wait_visible(zk_connect: str, topic: str, count: int, timeout: float = 30) -> dict[int, list[Message]]:
    """Wait until `count` messages of `topic` are flushed (visible), and return them."""
    return wait_until(lambda: (m := read_topic(zk_connect, topic)) and sum(map(len, m.values())) >= count and m,
                      timeout, f"{count} visible messages in {topic}")


class Collector:
    """Reads every stream of a group member in its own thread, keeping what arrives."""

    def __init__(self, group: ConsumerGroup) -> None:
        self.group = group
        self.messages: list = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._read, args=(s,), daemon=True)
                         for streams in group.streams.values() for s in streams]
        for t in self._threads:
            t.start()

    def _read(self, stream) -> None:
        while True:
            try:
                for message in stream:
                    with self._lock:
                        self.messages.append(message)
                return  # closed
            except ConsumerTimeout:
                continue

    def values(self) -> list[bytes]:
        with self._lock:
            return [m.value for m in self.messages]

    def close(self) -> None:
        self.group.close()
        for t in self._threads:
            t.join(10)


def per_window(topic: str, messages: list[Message]) -> dict[tuple[str, int], int]:
    """Records per (topic, window of their timestamp): what the brokers' record counts
    (the audit's broker tier) must hold for `messages`."""
    out: dict[tuple[str, int], int] = {}
    for m in messages:
        key = (topic, m.timestamp - m.timestamp % WINDOW_MS)
        out[key] = out.get(key, 0) + 1
    return out
