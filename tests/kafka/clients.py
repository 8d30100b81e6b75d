"""Small helpers around the real Kafka clients for the listener's tests."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from harness.process import wait_until


def producer(bootstrap: str, **settings) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                     "linger.ms": 5, **settings})


def produce_all(p: Producer, topic: str, records: list[tuple[bytes | None, bytes, list]], partition: int = 0) -> list:
    """Produce, flush, and return each record's delivery report (error, offset)."""
    reports: list = [None] * len(records)

    def on_delivery(i):
        return lambda err, msg: reports.__setitem__(i, (err, msg.offset() if err is None else None))

    for i, (key, value, headers) in enumerate(records):
        p.produce(topic, value, key, partition=partition, headers=headers, on_delivery=on_delivery(i))
        p.poll(0)
    assert p.flush(60) == 0, "messages left undelivered"
    return reports


def read_from(bootstrap: str, topic: str, partition: int, offset: int, count: int, timeout: float = 60) -> list:
    """`count` messages of a partition from `offset`, by a consumer assigned (no group)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, partition, offset)])
    got: list = []
    try:
        def more() -> bool:  # all that is ready, not one message per wait_until interval
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is None:
                    got.append(msg)
                elif msg.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(f"consumer error: {msg.error()}")
            return len(got) >= count

        wait_until(more, timeout, f"{count} messages of {topic}-{partition} from {offset}")
    finally:
        consumer.close()
    return got[:count]
