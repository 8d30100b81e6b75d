"""librdkafka (confluent-kafka) against logbus's Kafka listener in the paper's
experiments (issue 36): one producer, then one consumer of the same partition, on the
broker the native client runs against (started with a Kafka listener too).

The producer has the settings a throughput-minded user sets — linger.ms 5, batch.size
1 MB, no compression — with acks=1 and idempotence off, as the native client's paper
rows. Samples count records delivered: produced minus those still in librdkafka's
queue or in flight (`len(producer)`), so no callback a record. The consumer fetches
about 200 KB a partition a request (max.partition.fetch.bytes), as the native
consumer's fetch size, and resumes fetching 10 ms after its local queue was full
(fetch.queue.backoff.ms; librdkafka's default pause of 1 s decides a short run).
"""

from __future__ import annotations

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

SYSTEM = "logbus (librdkafka)"
PRODUCE_SETTING = "linger 5 ms, batch.size 1 MB, acks=1"
CONSUME_SETTING = "fetch 200 KB"
PRODUCER = {"acks": "1", "enable.idempotence": False, "linger.ms": 5, "batch.size": 1_000_000,
            "batch.num.messages": 10_000, "compression.type": "none", "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576}


def produce(bootstrap: str, topic: str, messages: int, payload: bytes, sampler) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "paper-bench-librdkafka", **PRODUCER})
    producer.list_topics(topic, timeout=30)  # metadata and connection before the clock
    send, poll = producer.produce, producer.poll
    sampler.start()
    sent = 0
    for chunk in sampler.chunks(messages):
        for _ in range(chunk):
            while True:
                try:
                    send(topic, payload, partition=0)
                    break
                except BufferError:
                    poll(0.005)
        sent += chunk
        poll(0)
        sampler.tick(sent - len(producer) - sampler.done)
    left = producer.flush(600)
    sampler.tick(sent - left - sampler.done)
    sampler.finish()
    if left:
        raise RuntimeError(f"librdkafka producer: {left:,} records not delivered")


def received(consumer: Consumer, most: int) -> int:
    """How many records one `consume` call returned (at most `most`); an error raises."""
    batch = consumer.consume(most, 0.5)
    for message in batch:
        if message.error():
            raise KafkaException(message.error())
    return len(batch)


def consume(bootstrap: str, topic: str, messages: int, sampler) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "paper-bench-librdkafka",
                         "enable.auto.commit": False, "max.partition.fetch.bytes": 200 * 1024,
                         "fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 10})
    got = empty = 0
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        sampler.start()
        while got < messages and empty < 50:
            n = received(consumer, 1000)
            empty = 0 if n else empty + 1
            got += n
            sampler.add(n)
        sampler.finish()
    finally:
        consumer.close()
    return got
