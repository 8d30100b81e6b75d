"""The Kafka listener's administrative APIs (docs/kafka.md, "Administration") through
the real clients: confluent-kafka's AdminClient (librdkafka) and kafka-python's
KafkaAdminClient — CreateTopics (validate_only, an existing topic, bad partitions,
replica assignments, configs), DeleteTopics, DescribeConfigs of a topic and of the
broker. One broker with a Kafka listener, real ZooKeeper."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from harness.cluster import BrokerProcess, LocalCluster
from harness.process import wait_until
from harness.proxy import TcpProxy

TIMEOUT = 30


@pytest.fixture
def admin_broker(cluster: LocalCluster) -> BrokerProcess:
    """A broker whose topics get 2 partitions by default and `retained` a retention of
    its own (log.retention.ms.per.topic)."""
    return cluster.start_broker(0, {"num.partitions": 2, "log.retention.ms.per.topic": "retained:60000"}, kafka=True)


def admin_client(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.kafka_bootstrap})


def outcomes(futures: dict) -> dict[str, KafkaError | None]:
    """Each topic's outcome: None, or the error the client raised for it."""
    outcome = {}
    for name, future in futures.items():
        try:
            future.result(TIMEOUT)
            outcome[name] = None
        except KafkaException as exc:
            outcome[name] = exc.args[0]
    return outcome


def create(admin: AdminClient, *topics: NewTopic, **options) -> dict[str, KafkaError | None]:
    return outcomes(admin.create_topics(list(topics), request_timeout=TIMEOUT, **options))


def topic_partitions(admin: AdminClient, name: str) -> int | None:
    topics = admin.list_topics(timeout=TIMEOUT).topics
    return len(topics[name].partitions) if name in topics else None


def test_create_topics_and_list_them(admin_broker):
    admin = admin_client(admin_broker)
    a, b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    assert create(admin, NewTopic(a, 3, 1), NewTopic(b)) == {a: None, b: None}  # b: the broker's defaults
    assert (topic_partitions(admin, a), topic_partitions(admin, b)) == (3, 2)


def test_validate_only_creates_nothing(admin_broker):
    admin = admin_client(admin_broker)
    name = f"v-{uuid.uuid4().hex[:8]}"
    assert create(admin, NewTopic(name, 2, 1), validate_only=True) == {name: None}
    assert topic_partitions(admin, name) is None
    refused = create(admin, NewTopic(name, 0, 1), validate_only=True)[name]
    assert refused.code() == KafkaError.INVALID_PARTITIONS


def test_an_existing_topic_is_refused_and_kept(admin_broker):
    admin = admin_client(admin_broker)
    name = f"e-{uuid.uuid4().hex[:8]}"
    assert create(admin, NewTopic(name, 1, 1)) == {name: None}
    for validate_only in (True, False):
        refused = create(admin, NewTopic(name, 4, 1), validate_only=validate_only)[name]
        assert refused.code() == KafkaError.TOPIC_ALREADY_EXISTS
    assert topic_partitions(admin, name) == 1


def test_bad_requests_each_get_their_code_and_the_good_one_is_created(admin_broker):
    admin = admin_client(admin_broker)
    names = {what: f"{what}-{uuid.uuid4().hex[:8]}" for what in
             ("partitions", "factor", "assigned", "config", "compact", "unknown", "name", "good")}
    outcome = create(
        admin,
        NewTopic(names["partitions"], 100_000, 1),
        NewTopic(names["factor"], 1, 3),  # one live broker
        NewTopic(names["assigned"], 2, replica_assignment=[[0], [0]]),
        NewTopic(names["config"], 1, 1, config={"retention.ms": "1000"}),
        NewTopic(names["compact"], 1, 1, config={"cleanup.policy": "compact"}),
        NewTopic(names["unknown"], 1, 1, config={"compression.typo": "zstd"}),
        NewTopic("bad/name", 1, 1),
        NewTopic(names["good"], 1, 1, config={"cleanup.policy": "delete"}),  # what every topic has
    )
    codes = {name: (error.code() if error else None) for name, error in outcome.items()}
    assert codes == {
        names["partitions"]: KafkaError.INVALID_PARTITIONS,
        names["factor"]: KafkaError.INVALID_REPLICATION_FACTOR,
        names["assigned"]: KafkaError.INVALID_REQUEST,
        names["config"]: KafkaError.INVALID_CONFIG,
        names["compact"]: KafkaError.INVALID_CONFIG,
        names["unknown"]: KafkaError.INVALID_CONFIG,
        "bad/name": KafkaError.TOPIC_EXCEPTION,
        names["good"]: None,
    }
    assert "log.retention.ms.per.topic" in outcome[names["config"]].str()  # the reason reaches the client
    assert "logbus assigns replicas" in outcome[names["assigned"]].str()
    listed = admin.list_topics(timeout=TIMEOUT).topics
    assert [n for n in names.values() if n in listed] == [names["good"]]


def delete(admin: AdminClient, *names: str, **options) -> dict[str, KafkaError | None]:
    return outcomes(admin.delete_topics(list(names), request_timeout=TIMEOUT, **options))


def test_delete_topics_deletes_and_the_name_starts_again_empty(admin_broker):
    """librdkafka's DeleteTopics (v4 here): the topic is gone from list_topics when the
    answer comes, an unknown one is UNKNOWN_TOPIC_OR_PART, and a topic created again
    under the name has none of the old records."""
    from confluent_kafka import Consumer, Producer

    admin = admin_client(admin_broker)
    name = f"d-{uuid.uuid4().hex[:8]}"
    assert create(admin, NewTopic(name, 1, 1)) == {name: None}
    producer = Producer({"bootstrap.servers": admin_broker.kafka_bootstrap, "enable.idempotence": True})
    for i in range(10):
        producer.produce(name, b"old-%d" % i, partition=0)
    assert producer.flush(TIMEOUT) == 0
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    outcome = delete(admin, name, missing, operation_timeout=TIMEOUT)
    assert outcome[name] is None
    assert outcome[missing].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert topic_partitions(admin, name) is None

    assert create(admin, NewTopic(name, 1, 1)) == {name: None}
    producer.produce(name, b"new", partition=0)  # the same idempotent producer: its sequence goes on
    assert producer.flush(TIMEOUT) == 0
    consumer = Consumer({"bootstrap.servers": admin_broker.kafka_bootstrap, "group.id": f"g-{name}",
                         "auto.offset.reset": "earliest", "enable.partition.eof": True})
    try:
        consumer.subscribe([name])
        values = []
        while True:
            message = consumer.poll(TIMEOUT)
            assert message is not None, "no end of partition within the timeout"
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF
                break
            values.append((message.offset(), message.value()))
    finally:
        consumer.close()
        producer.flush(TIMEOUT)
    assert values == [(0, b"new")]


def test_a_broker_with_deletion_disabled_answers_topic_deletion_disabled(cluster):
    broker = cluster.start_broker(0, {"delete.topic.enable": "false"}, kafka=True)
    admin = admin_client(broker)
    name = f"kept-{uuid.uuid4().hex[:8]}"
    assert create(admin, NewTopic(name, 1, 1)) == {name: None}
    assert delete(admin, name)[name].code() == KafkaError.TOPIC_DELETION_DISABLED
    assert topic_partitions(admin, name) == 1


def describe(admin: AdminClient, resource: ConfigResource) -> dict[str, str]:
    entries = admin.describe_configs([resource], request_timeout=TIMEOUT)[resource].result(TIMEOUT)
    return {name: entry.value for name, entry in entries.items()}


def test_describe_configs_of_a_topic_and_the_broker(admin_broker):
    admin = admin_client(admin_broker)
    assert create(admin, NewTopic("retained", 1, 1)) == {"retained": None}
    topic = describe(admin, ConfigResource(ResourceType.TOPIC, "retained"))
    assert topic["retention.ms"] == "60000"  # its own, from log.retention.ms.per.topic
    assert (topic["cleanup.policy"], topic["max.message.bytes"], topic["retention.bytes"]) == (
        "delete", str(1 << 20), "-1")
    broker = describe(admin, ConfigResource(ResourceType.BROKER, "0"))
    assert (broker["num.partitions"], broker["auto.create.topics.enable"], broker["log.retention.ms"]) == (
        "2", "true", str(7 * 24 * 3600 * 1000))
    unknown = ConfigResource(ResourceType.TOPIC, f"missing-{uuid.uuid4().hex[:8]}")
    with pytest.raises(KafkaException) as refused:
        describe(admin, unknown)
    assert refused.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_kafka_python_admin_creates_describes_and_deletes(admin_broker):
    """kafka-python picks the highest versions (CreateTopics v7, DeleteTopics v5,
    DescribeConfigs v4)."""
    from kafka.admin import ConfigResource as KpResource, ConfigResourceType, KafkaAdminClient, NewTopic as KpTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=admin_broker.kafka_bootstrap, request_timeout_ms=TIMEOUT * 1000)
    try:
        name = f"kp-{uuid.uuid4().hex[:8]}"
        admin.create_topics([KpTopic(name, 2, 1)])
        assert name in admin.list_topics()
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([KpTopic(name, 2, 1)])
        described = admin.describe_configs([KpResource(ConfigResourceType.TOPIC, name)], config_filter="all")
        assert described["topic"][name]["cleanup.policy"]["value"] == "delete"
        [deleted] = admin.delete_topics([name], raise_errors=False)["topics"]
        assert deleted["error_code"] == 0
        assert name not in admin.list_topics()
    finally:
        admin.close()


def test_a_creation_zookeeper_does_not_finish_in_time_is_answered_timed_out(cluster, zookeeper, zk_connect):
    """ZooKeeper unreachable from the broker (through a proxy cut for the test): the
    answer comes at the request's timeout, REQUEST_TIMED_OUT, not at ZooKeeper's pace;
    the write goes on, and the topic exists once ZooKeeper is back."""
    host, port = zookeeper.connect_string.split(",")[0].split(":")
    with TcpProxy((host, int(port))) as proxy:
        broker = cluster.start_broker(0, {"zookeeper.session.timeout.ms": 30_000}, kafka=True,
                                      zookeeper=proxy.address + zk_connect[zk_connect.index("/"):])
        admin = admin_client(broker)
        assert admin.list_topics(timeout=TIMEOUT).brokers  # connected before the cut
        name = f"slow-{uuid.uuid4().hex[:8]}"
        proxy.cut()
        try:
            refused = create(admin, NewTopic(name, 1, 1), operation_timeout=2)[name]
        finally:
            proxy.restore()
        assert refused.code() == KafkaError.REQUEST_TIMED_OUT
        wait_until(lambda: topic_partitions(admin, name) == 1, TIMEOUT, f"{name} to be created after all")


def test_a_deletion_not_complete_within_timeout_ms_is_request_timed_out(cluster, zk):
    """kafka-python's DeleteTopics v5 with timeout_ms=300 while the controller (the other
    broker, paused) cannot carry it out: REQUEST_TIMED_OUT, and the deletion completes
    once the controller runs again."""
    from kafka.admin import KafkaAdminClient, NewTopic as KpTopic

    holder = cluster.start_broker(1)
    wait_until(lambda: zk.exists("/controller") is not None, TIMEOUT, "broker 1 to be the controller")
    broker = cluster.start_broker(0, kafka=True)
    admin = KafkaAdminClient(bootstrap_servers=broker.kafka_bootstrap, request_timeout_ms=TIMEOUT * 1000)
    name = f"slow-{uuid.uuid4().hex[:8]}"
    try:
        admin.create_topics([KpTopic(name, 1, 1)])
        holder.pause()
        try:
            [deleted] = admin.delete_topics([name], timeout_ms=300, raise_errors=False)["topics"]
        finally:
            holder.resume()
        assert deleted["error_code"] == KafkaError.REQUEST_TIMED_OUT
        assert "marked for deletion" in deleted["error_message"]
        wait_until(lambda: name not in admin.list_topics(), TIMEOUT, "the deletion to complete")
    finally:
        admin.close()
