"""A mirror whose principal the secured target refuses (docs/operations.md,
"Mirroring"): no permission to create the missing monitoring topic stops it at start,
no permission to write a mirrored topic at its first write — each with `MirrorRefused`
naming the topic and the permission, where it used to retry forever."""

from __future__ import annotations

import threading

import pytest

from broker.client.consumer import SimpleConsumer
from broker.client.errors import MirrorRefused
from broker.client.mirror import Mirror, MirrorSource
from broker.client.monitoring import MONITORING_TOPIC
from broker.client.producer import Producer
from broker.common.acls import Operation, ResourceType
from broker.common.zklayout import create_topic
from harness.process import wait_until
from harness.secured import secured_cluster

pytestmark = pytest.mark.slow

WRITER = "User:mirror-writer"


def how_it_stops(mirror: Mirror) -> BaseException | None:
    """What `mirror.run` raised; fails the test if it still runs after 60 s."""
    stop, outcome = threading.Event(), {}

    def run() -> None:
        try:
            mirror.run(stop)
        except BaseException as exc:
            outcome["error"] = exc

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(60)
    stopped = not runner.is_alive()
    stop.set()
    runner.join(30)
    mirror.close()
    assert stopped, "the mirror still runs 60 s after a refusal retrying cannot fix"
    return outcome.get("error")


def test_a_mirror_the_target_refuses_stops_naming_the_topic_and_the_permission(tmp_path):
    with secured_cluster(1, tmp_path / "east") as east, secured_cluster(1, tmp_path / "offline") as offline:
        east_zk, offline_zk = east.connect_string, offline.connect_string
        create_topic(east.admin_zk, "clicks", 1)
        east.add_user("mirror-reader", "reader-secret")
        east.allow("User:mirror-reader", Operation.READ, ResourceType.TOPIC, "clicks")
        offline.add_user("mirror-writer", "writer-secret")
        with Producer(zookeeper=east_zk, security=east.scram("admin", "admin-secret"), monitoring=False) as producer:
            producer.send("clicks", b"click")

        def mirror() -> Mirror:
            source = MirrorSource("east", zookeeper=east_zk, security=east.scram("mirror-reader", "reader-secret"))
            return Mirror("refused", [source], offline_zk, topics=["clicks"],
                          target_security=offline.scram("mirror-writer", "writer-secret"))

        refused = how_it_stops(mirror())  # no Create on the missing monitoring topic
        assert isinstance(refused, MirrorRefused), refused
        assert repr(MONITORING_TOPIC) in str(refused) and "Create" in str(refused), refused
        assert not offline.admin_zk.exists("/brokers/topics/clicks"), "it copied before refusing"

        for operation in (Operation.CREATE, Operation.WRITE):
            offline.allow(WRITER, operation, ResourceType.TOPIC, MONITORING_TOPIC)
        offline.allow(WRITER, Operation.CREATE, ResourceType.TOPIC, "clicks")
        refused = how_it_stops(mirror())  # no Write on the mirrored topic
        assert isinstance(refused, MirrorRefused), refused
        assert "'clicks'" in str(refused) and "Write" in str(refused), refused

        offline.allow(WRITER, Operation.WRITE, ResourceType.TOPIC, "clicks")
        runs = mirror()  # granted what the message asked for: it copies
        stop = threading.Event()
        runner = threading.Thread(target=runs.run, args=(stop,), daemon=True)
        runner.start()
        try:
            values: list[bytes] = []
            with SimpleConsumer("clicks", 0, offline_zk, max_wait_ms=100,
                                security=offline.scram("admin", "admin-secret")) as consumer:
                wait_until(lambda: values.extend(m.value for m in consumer.fetch()) or values, 60,
                           "the mirrored message")
            assert values == [b"click"]
        finally:
            stop.set()
            runner.join(30)
            runs.close()
