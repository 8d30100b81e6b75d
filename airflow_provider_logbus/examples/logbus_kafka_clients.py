"""Airflow's own Kafka provider (`apache-airflow-providers-apache-kafka`) against logbus's
Kafka listener (docs/kafka.md): a team whose DAGs already produce and consume with the
Kafka provider points its Kafka connections at logbus and changes nothing else.

    produce  ──►  consume (a consumer group; commits at the end)
             ──►  wait_for_done (AwaitMessageSensor: deferred, its trigger in the triggerer)

Connections (conn_type `kafka`, the provider's; its extra is librdkafka's configuration):
`logbus_kafka` for the producer and the consumer, `logbus_kafka_watch` for the sensor,
which needs a consumer group of its own (the consumer's group has committed past the
marker by the time it runs)::

    AIRFLOW_CONN_LOGBUS_KAFKA='{"conn_type": "kafka", "extra": {"bootstrap.servers": "broker1:9093",
        "group.id": "logbus-example-consume", "auto.offset.reset": "earliest", "enable.idempotence": true}}'

Records written here are ordinary logbus data: the hourly load reads them like any other
(their headers become the table's `headers` column).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any, Iterator

from airflow.providers.apache.kafka.operators.consume import ConsumeFromTopicOperator
from airflow.providers.apache.kafka.operators.produce import ProduceToTopicOperator
from airflow.providers.apache.kafka.sensors.kafka import AwaitMessageSensor
from airflow.sdk import DAG

TOPIC = os.environ.get("LOGBUS_KAFKA_EXAMPLE_TOPIC", "kafka_clients_example")
EVENTS = int(os.environ.get("LOGBUS_KAFKA_EXAMPLE_EVENTS", "100"))
DONE = b'{"done": true}'


def page_views(count: int) -> Iterator[tuple[bytes, bytes]]:
    """What a web server would send: keyed page views, then a marker."""
    now = int(datetime.now(timezone.utc).timestamp() * 1000)
    for i in range(count):
        yield f"user-{i % 7}".encode(), json.dumps({"page": f"/p/{i}", "ts": now + i}).encode()
    yield b"marker", DONE


def check_page_view(message: Any) -> None:
    """Each record a consumer reads must be a page view or the marker (JSON)."""
    if message.error() is not None:
        raise RuntimeError(f"consumer error: {message.error()}")
    json.loads(message.value())


def done_marker(message: Any) -> str | None:
    """The sensor's test: the marker ends the wait (its offset is the event)."""
    return f"marker at offset {message.offset()}" if message.value() == DONE else None


with DAG(
    dag_id="logbus_kafka_clients",
    schedule=None,
    start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    tags=["logbus", "example", "kafka"],
) as dag:
    produce = ProduceToTopicOperator(
        task_id="produce", kafka_config_id="logbus_kafka", topic=TOPIC, producer_function=page_views,
        producer_function_kwargs={"count": EVENTS}, synchronous=False)
    consume = ConsumeFromTopicOperator(
        task_id="consume", kafka_config_id="logbus_kafka", topics=[TOPIC], apply_function=check_page_view,
        max_messages=EVENTS + 1, commit_cadence="end_of_operator", poll_timeout=10)
    wait_for_done = AwaitMessageSensor(
        task_id="wait_for_done", kafka_config_id="logbus_kafka_watch", topics=[TOPIC],
        apply_function="airflow_provider_logbus.examples.logbus_kafka_clients.done_marker", poll_timeout=1,
        poll_interval=1)
    produce >> [consume, wait_for_done]
