"""Crashes and damaged files: nothing acknowledged with acks=-1 is lost, logs end on a
message boundary, and damage is repaired at start-up."""

import os
import subprocess
import sys
import textwrap

from broker.common.message import scan
from harness.process import wait_until

from .brokerutil import connect, produce, read_partition

PRODUCER = textwrap.dedent(
    """
    import sys
    from broker.client.connection import BrokerConnection
    from broker.common.message import encode_message_set
    host, port, topic = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    conn = BrokerConnection(host, port).connect()
    i = 0
    while True:
        data = encode_message_set([(None, b"msg-%08d" % (i + j) + b"." * 150, 1) for j in range(10)])
        try:
            conn.produce(topic, 0, data, acks=-1)
        except Exception:
            break
        print(i + 9, flush=True)  # acknowledged up to this number
        i += 10
    """
)


def test_sigkill_during_acks_all_loses_nothing_acknowledged(cluster):
    broker = cluster.start_broker(0, {"log.flush.interval.ms": 10_000, "log.segment.bytes": 64 * 1024})
    with connect(broker) as conn:
        conn.create_topic("durable", 1)
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, "127.0.0.1", str(broker.port), "durable"],
        stdout=subprocess.PIPE, text=True,
    )
    acknowledged = -1
    try:
        for line in producer.stdout:
            acknowledged = int(line)
            if acknowledged >= 3000:
                break
        broker.kill()  # SIGKILL while the producer is still sending
        for line in producer.stdout:
            acknowledged = int(line)
    finally:
        producer.kill()
        producer.wait()
    assert acknowledged >= 3000
    broker = cluster.start_broker(0)
    with connect(broker) as conn:
        numbers = [int(m.value[4:12]) for m in read_partition(conn, "durable", 0, max_bytes=256 * 1024)]
    assert numbers[: acknowledged + 1] == list(range(acknowledged + 1))
    assert numbers == list(range(len(numbers)))  # in order, no holes, no duplicates
    for segment in (broker.log_dir / "durable-0").glob("*.kafka"):
        assert scan(segment.read_bytes()).error is None  # every segment ends on a message boundary


def _stopped_broker_with_data(cluster, values):
    broker = cluster.start_broker(0)
    with connect(broker) as conn:
        conn.create_topic("damaged", 1)
        produce(conn, "damaged", 0, values)
    broker.stop()
    (segment,) = (broker.log_dir / "damaged-0").glob("*.kafka")
    return broker, segment


def test_garbage_past_the_last_write_is_cut_at_startup(cluster):
    values = [b"value-%d" % i for i in range(50)]
    broker, segment = _stopped_broker_with_data(cluster, values)
    good_size = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(os.urandom(3000))
    (broker.log_dir / ".clean_shutdown").unlink()  # as after a crash
    cluster.start_broker(0)
    assert segment.stat().st_size == good_size
    assert "truncating at byte %d" % good_size in broker.log_tail(80)
    with connect(broker) as conn:
        assert [m.value for m in read_partition(conn, "damaged", 0)] == values
        result = produce(conn, "damaged", 0, [b"after repair"])
        assert result.base_offset == good_size


def test_truncated_tail_is_cut_to_the_last_whole_message(cluster):
    values = [b"value-%d" % i for i in range(50)]
    broker, segment = _stopped_broker_with_data(cluster, values)
    os.truncate(segment, segment.stat().st_size - 5)  # lost tail block
    (broker.log_dir / ".clean_shutdown").unlink()
    cluster.start_broker(0)
    with connect(broker) as conn:
        assert [m.value for m in read_partition(conn, "damaged", 0)] == values[:-1]
    assert scan(segment.read_bytes()).error is None


def test_clean_shutdown_skips_recovery(cluster):
    broker, segment = _stopped_broker_with_data(cluster, [b"x"])
    assert (broker.log_dir / ".clean_shutdown").exists()
    cluster.start_broker(0)
    assert "(clean shutdown)" in broker.log_tail(80)


def test_retention_deletes_old_segments_while_a_consumer_reads(cluster):
    broker = cluster.start_broker(0, {
        "log.segment.bytes": 2048, "log.retention.bytes": 4096, "log.retention.check.interval.ms": 200,
    })
    with connect(broker) as writer, connect(broker) as reader:
        writer.create_topic("retained", 1)
        offset, seen, resets = 0, 0, 0
        for i in range(200):
            produce(writer, "retained", 0, [b"%05d" % i * 20])
            try:
                batch = read_partition(reader, "retained", 0, offset, max_bytes=700)
            except Exception as exc:  # only OffsetOutOfRange is acceptable
                assert type(exc).__name__ == "OffsetOutOfRange"
                offset = reader.offsets("retained", 0, -2)[0]
                resets += 1
                continue
            for m in batch:
                assert m.value == m.value[:5] * 20  # whole, uncorrupted messages
            seen += len(batch)
            if batch:
                offset = batch[-1].next_offset
        wait_until(lambda: reader.offsets("retained", 0, -2)[0] > 0, 30, "retention to delete a segment")
        assert seen > 0
        earliest = reader.offsets("retained", 0, -2)[0]
        assert earliest % (20 * 5 + 22) == 0  # a segment start, on a message boundary

        def first_file_is_the_earliest() -> bool:  # retention unlinks a file just after it leaves the log
            files = sorted((broker.log_dir / "retained-0").glob("*.kafka"))
            return int(files[0].name[:20]) == reader.offsets("retained", 0, -2)[0]

        wait_until(first_file_is_the_earliest, 10, "the oldest segment file to be the earliest offset's")


def test_retention_by_time_uses_message_timestamps(cluster):
    broker = cluster.start_broker(0, {
        "log.segment.bytes": 1024, "log.retention.ms": 3_600_000, "log.retention.check.interval.ms": 200,
    })
    import time

    now = int(time.time() * 1000)
    with connect(broker) as conn:
        conn.create_topic("aged", 1)
        for i in range(20):
            produce(conn, "aged", 0, [b"old" * 30], ts=now - 2 * 3_600_000)  # two hours old
        for i in range(20):
            produce(conn, "aged", 0, [b"new" * 30], ts=now)
        wait_until(lambda: conn.offsets("aged", 0, -2)[0] > 0, 30, "time retention")
        values = {m.value for m in read_partition(conn, "aged", 0, conn.offsets("aged", 0, -2)[0])}
    assert b"new" * 30 in values
    assert conn.offsets("aged", 0, -1)[0] == 40 * (90 + 22)  # offsets kept growing


def test_per_topic_retention_override_keeps_the_monitoring_topic(cluster):
    broker = cluster.start_broker(0, {
        "log.segment.bytes": 1024, "log.retention.bytes": 2048, "log.retention.check.interval.ms": 200,
        "log.retention.bytes.per.topic": "_logbus_monitoring:-1",
    })
    now = int(__import__("time").time() * 1000)  # recent, so only size retention applies
    with connect(broker) as conn:
        for topic in ("busy", "_logbus_monitoring"):
            conn.create_topic(topic, 1)
            for i in range(40):
                produce(conn, topic, 0, [b"x" * 100], ts=now)
        wait_until(lambda: conn.offsets("busy", 0, -2)[0] > 0, 30, "size retention on the busy topic")
        assert conn.offsets("_logbus_monitoring", 0, -2) == [0]
        assert len(read_partition(conn, "_logbus_monitoring", 0)) == 40
