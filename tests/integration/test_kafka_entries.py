"""Magic-4 entries (Kafka batches the broker stored, docs/kafka.md "Record batches")
served by a real broker to the native consumers (SimpleConsumer, a group member's
stream): in order with the native messages around them, headers kept, and a fetch at a
record inside a batch answered from it."""

from __future__ import annotations

from broker.client.consumer import SimpleConsumer
from broker.client.group import ConsumerGroup
from broker.common.kafka.records import check_batch
from broker.server.log.log import Log, LogConfig
from tests.unit.test_kafka_records import librdkafka_batch

from harness.process import wait_until
from tests.integration.clientutil import Collector

from .brokerutil import connect, produce


def test_the_native_consumer_reads_kafka_batches_the_broker_stored(cluster, zk_connect):
    broker = cluster.start_broker(0)
    with connect(broker) as conn:
        conn.create_topic("mixed", 1)
        produce(conn, "mixed", 0, [b"native-0"])
    broker.stop()
    # what the Kafka listener does with a produced batch: the broker's own append, here on its stopped log
    log = Log(broker.log_dir / "mixed-0", "mixed", 0, LogConfig())
    batch, _ = librdkafka_batch("lz4", 50)
    appended = log.append_kafka(batch, check_batch(batch), 0)
    assert log.close()
    cluster.start_broker(0)
    with connect(broker) as conn:
        produce(conn, "mixed", 0, [b"native-1"])
    position = appended.base_offset
    with SimpleConsumer("mixed", 0, zookeeper=zk_connect, offset="smallest", fetch_size=300) as consumer:
        messages = list(consumer)
        assert [m.offset for m in messages] == [0, *range(position, position + 50), appended.next_offset]
        assert [m.value for m in messages][::50] == [b"native-0", b"value-49" * 20]
        assert messages[-1].value == b"native-1" and messages[10].headers == (("h", b"9"),)
        consumer.seek(position + 20)  # a record inside the batch: the broker answers with the batch
        assert [m.offset for m in consumer.fetch()][:2] == [position + 20, position + 21]
        assert consumer.latest() == appended.next_offset + len(messages[-1].value) + 22
    group = ConsumerGroup("readers", {"mixed": 1}, zk_connect, consumer_timeout_ms=200, max_wait_ms=100,
                          auto_offset_reset="smallest")
    collector = Collector(group)
    try:
        wait_until(lambda: len(collector.values()) >= 52, 60, "every record through the group's stream")
    finally:
        group.close()
    consumed = [(m.offset, m.value, m.headers) for m in collector.messages]
    assert consumed == [(m.offset, m.value, m.headers) for m in messages]
