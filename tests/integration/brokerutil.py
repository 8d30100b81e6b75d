"""Small helpers for broker tests: produce values and read a partition back."""

from __future__ import annotations

from broker.client.connection import BrokerConnection
from broker.common.message import Message, encode_message_set, iter_messages
from harness.cluster import BrokerProcess


def connect(broker: BrokerProcess, timeout: float = 30) -> BrokerConnection:
    return BrokerConnection(*broker.address, client_id="test", timeout=timeout).connect()


def produce(conn: BrokerConnection, topic: str, partition: int, values: list[bytes], acks: int = -1, ts: int = 1000):
    data = encode_message_set([(None, v, ts + i) for i, v in enumerate(values)])
    return conn.produce(topic, partition, data, acks=acks)


def read_partition(conn: BrokerConnection, topic: str, partition: int, offset: int = 0,
                   max_bytes: int = 1 << 20) -> list[Message]:
    """Every visible message from `offset` on."""
    messages: list[Message] = []
    while True:
        response = conn.fetch(topic, partition, offset, max_bytes)
        batch = list(iter_messages(response.messages, offset))
        if not batch:
            return messages
        messages += batch
        offset = batch[-1].next_offset


def wait_flushed(conn: BrokerConnection, topic: str, partition: int, offset: int, timeout: float = 30) -> None:
    """Wait until the partition's high watermark reaches `offset` (acks=1 data becomes visible)."""
    from harness.process import wait_until

    wait_until(lambda: conn.offsets(topic, partition, -1)[0] >= offset, timeout, f"{topic}-{partition} flushed to {offset}")
