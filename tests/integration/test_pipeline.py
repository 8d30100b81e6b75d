"""`Pipeline.send` with an `encode`: each batch is encoded as its request is written,
so the broker appends the first requests while the next are encoded (issue 38); a
batch that cannot be encoded fails alone, and nothing is written twice or out of order."""

from __future__ import annotations

from broker.client.cluster import ConnectionPool
from broker.client.connection import BrokerConnection
from broker.client.metadata import open_metadata
from broker.client.pipeline import Outgoing, Pipeline
from broker.common.errors import LogbusError
from broker.common.message import encode_message_set
from broker.common.zklayout import create_topic
from harness.process import wait_until
from tests.integration.clientutil import read_topic, wait_visible

BIG = 70_000  # bytes of a value: past the pipeline's WRITE_BYTES, a request a write


def opened(broker, topic: str, partitions: int) -> bool:
    """The broker has opened every partition of `topic` (until then it answers UnknownTopic)."""
    with BrokerConnection(*broker.address, client_id="pipeline-test") as conn:
        try:
            return all(conn.offsets(topic, p, -1) is not None for p in range(partitions))
        except LogbusError:
            return False


def test_the_broker_appends_the_first_request_before_the_next_is_encoded(cluster, zk, zk_connect):
    """Encoding batch k waits until the broker holds batch k-1: it can only get there if
    batch k-1 was written before batch k was encoded. Encoded all before the first
    write (as before issue 38's change), the first wait times out and the test fails."""
    broker = cluster.start_broker(0)
    create_topic(zk, "streamed", 1)
    metadata = open_metadata(zk_connect, None, "pipeline-test")
    pool = ConnectionPool(metadata, "pipeline-test", 30)
    wait_until(lambda: metadata.partitions("streamed") and opened(broker, "streamed", 1), 30, "the topic's leader")
    values = [bytes([65 + k]) * BIG for k in range(4)]
    stored_before_encoding: list[int] = []

    def stored() -> int:
        return len(read_topic(zk_connect, "streamed").get(0, []))

    def encode(k: int) -> bytes:
        wait_until(lambda: stored() >= k, 20, f"batch {k - 1} on the broker before batch {k} is encoded")
        stored_before_encoding.append(stored())
        return encode_message_set([(None, values[k], 1)])

    try:
        outcomes = Pipeline(pool, 1, 10_000).send([Outgoing(k, "streamed", 0, 0, None) for k in range(4)], encode)
    finally:
        pool.close()
        metadata.close()
    assert [(o.batch, o.error) for o in outcomes] == [(k, None) for k in range(4)]
    assert stored_before_encoding == [0, 1, 2, 3]
    assert [m.value for m in wait_visible(zk_connect, "streamed", 4)[0]] == values, "each once, in order"


def test_a_batch_that_cannot_be_encoded_fails_alone_and_the_rest_arrive_in_order(cluster, zk, zk_connect):
    broker = cluster.start_broker(0)
    create_topic(zk, "halting", 2)
    metadata = open_metadata(zk_connect, None, "pipeline-test")
    pool = ConnectionPool(metadata, "pipeline-test", 30)
    wait_until(lambda: metadata.partitions("halting") and opened(broker, "halting", 2), 30, "the topic's leaders")
    broken = RuntimeError("cannot encode batch 2")

    def encode(k: int) -> bytes:
        if k == 2:
            raise broken
        return encode_message_set([(None, b"%d" % k, 1)])

    try:
        outcomes = Pipeline(pool, 1, 10_000).send(
            [Outgoing(k, "halting", k % 2, 0, None) for k in range(6)], encode)
    finally:
        pool.close()
        metadata.close()
    assert sorted((o.batch, o.error) for o in outcomes) == [(k, broken if k == 2 else None) for k in range(6)]
    stored = wait_visible(zk_connect, "halting", 5)
    assert [m.value for m in stored[0]] == [b"0", b"4"] and [m.value for m in stored[1]] == [b"1", b"3", b"5"]
