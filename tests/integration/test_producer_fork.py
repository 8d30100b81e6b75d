"""A producer made before a fork (gunicorn --preload, uWSGI): the child starts it afresh,
the parent keeps its own undelivered messages, and each message lands exactly once."""

from __future__ import annotations

import json
import os
from collections import Counter

from broker.client.metadata import open_metadata
from broker.client.producer import Producer
from broker.common.zklayout import create_topic
from tests.integration.clientutil import wait_visible


def _fork(body, producer: Producer) -> dict:
    """Run `body(producer)` in a forked child; its outcome, or the error it raised."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        outcome: dict = {}
        try:
            outcome = body(producer)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
            outcome = {"error": repr(exc)}
        finally:
            os.write(write_end, json.dumps(outcome).encode())
            os._exit(0)  # never back into pytest
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        outcome = json.loads(pipe.read() or "{}")
    os.waitpid(pid, 0)
    return outcome


def _close_only(producer: Producer) -> dict:
    """A worker that exits without sending (its shutdown hook closes the producer)."""
    report = producer.close(5)
    return {"delivered": report.delivered, "failed": len(report.failed)}


def _send_thirty(producer: Producer) -> dict:
    futures = [producer.send("forked", b"child %d" % i) for i in range(30)]
    report = producer.flush(30).delivered  # its own 30, none of the parent's 50
    offsets = [f.result(0).offset for f in futures]
    producer.close(30)
    return {"report": report, "offsets": offsets, "producer_id": producer.producer_id,
            "idempotent_id": producer.sender.idempotence.producer_id}


def test_a_producer_made_before_a_fork_starts_afresh_in_the_child(cluster, zk, zk_connect):
    cluster.start_broker(0)
    create_topic(zk, "forked", 2)
    producer = Producer(zookeeper=zk_connect, mode="async", linger_ms=60_000, delivery_timeout_ms=120_000,
                        batch_size=1000, monitoring=False)
    try:
        held = [producer.send("forked", b"parent before %d" % i) for i in range(50)]  # lingering, unsent
        assert _fork(_close_only, producer) == {"delivered": 0, "failed": 0}  # the parent's are not its own
        child = _fork(_send_thirty, producer)
        assert "error" not in child, child["error"]
        assert len(child["offsets"]) == 30 and child["report"] == 30
        assert child["producer_id"] != producer.producer_id  # its audit counts are its own

        assert not any(f.done() for f in held)  # the child neither sent nor failed the parent's
        after = producer.send("forked", b"parent after")
        assert producer.flush(30).delivered == 51  # the parent's session and connections survived the child
        assert after.done()
        assert all(f.result(0).offset >= 0 for f in held)
        # and its batches are numbered under an id of its own: the parent's cannot dedupe them away
        assert child["idempotent_id"] is not None
        assert child["idempotent_id"] != producer.sender.idempotence.producer_id
    finally:
        producer.close(30)

    landed = Counter(m.value for ms in wait_visible(zk_connect, "forked", 81).values() for m in ms)
    expected = {b"parent before %d" % i for i in range(50)} | {b"child %d" % i for i in range(30)} | {b"parent after"}
    assert set(landed) == expected
    assert set(landed.values()) == {1}


def test_a_producer_on_a_given_metadata_object_refuses_to_restart_in_the_child(cluster, zk, zk_connect):
    cluster.start_broker(0)
    create_topic(zk, "forked", 1)
    metadata = open_metadata(zk_connect)
    try:
        with Producer(metadata=metadata, monitoring=False) as producer:
            outcome = _fork(lambda p: {"offset": p.send("forked", b"child").offset}, producer)
            assert "ProducerClosed" in outcome["error"] and "metadata" in outcome["error"]
            assert producer.send("forked", b"parent").offset == 0  # the child sent nothing
    finally:
        metadata.close()
