"""`Mirror` between two secured clusters (harness.secured): it reads the source and
writes the target each as its own SCRAM user, held to ACLs on both sides."""

from __future__ import annotations

import threading

import pytest

from broker.client.consumer import SimpleConsumer
from broker.client.mirror import Mirror, MirrorSource
from broker.client.monitoring import MONITORING_TOPIC
from broker.client.producer import Producer
from broker.common.acls import Operation, ResourceType
from broker.common.zklayout import create_topic
from harness.process import wait_until
from harness.secured import SecuredCluster
from harness.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.slow


def test_the_mirror_crosses_two_secured_clusters(tmp_path):
    with ZooKeeperServer(tmp_path / "zk-east") as zk_east, ZooKeeperServer(tmp_path / "zk-offline") as zk_offline:
        east, offline = SecuredCluster(tmp_path / "east", zk_east), SecuredCluster(tmp_path / "offline", zk_offline)
        try:
            east.start(1)
            offline.start(1)
            east.add_user("mirror-reader", "reader-secret")
            offline.add_user("mirror-writer", "writer-secret")
            east.allow("User:mirror-reader", Operation.READ, ResourceType.TOPIC, "clicks")
            for topic in ("clicks", MONITORING_TOPIC):
                offline.allow("User:mirror-writer", Operation.WRITE, ResourceType.TOPIC, topic)
                offline.allow("User:mirror-writer", Operation.CREATE, ResourceType.TOPIC, topic)
            create_topic(east.admin_zk, "clicks", 1)
            admin = east.scram("admin", "admin-secret")
            with Producer(zookeeper=east.connect_string, security=admin, monitoring=False) as producer:
                for i in range(40):
                    producer.send("clicks", b"click %d" % i)
            source = MirrorSource("east", zookeeper=east.connect_string,
                                  security=east.scram("mirror-reader", "reader-secret"))
            mirror = Mirror("secured", [source], offline.connect_string, topics=["clicks"],
                            target_security=offline.scram("mirror-writer", "writer-secret"))
            stop = threading.Event()
            runner = threading.Thread(target=mirror.run, args=(stop,), daemon=True)
            runner.start()
            values: list[bytes] = []
            try:
                wait_until(lambda: mirror.target.partitions("clicks"), 60, "the mirror to create the target topic")
                with SimpleConsumer("clicks", 0, offline.connect_string, max_wait_ms=100,
                                    security=offline.scram("admin", "admin-secret")) as consumer:
                    wait_until(lambda: values.extend(m.value for m in consumer.fetch()) or len(values) >= 40, 60,
                               "the mirrored messages")
            finally:
                stop.set()
                runner.join(30)
                mirror.close()
            assert values == [b"click %d" % i for i in range(40)]
        finally:
            east.stop()
            offline.stop()
