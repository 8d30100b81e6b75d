"""A broker with a Kafka listener beside its native one (docs/kafka.md), for the real
Kafka clients' tests."""

from __future__ import annotations

import pytest

from harness.cluster import BrokerProcess, LocalCluster


@pytest.fixture
def kafka_broker(cluster: LocalCluster) -> BrokerProcess:
    """One broker; Kafka clients reach it at `kafka_broker.kafka_bootstrap`."""
    return cluster.start_broker(0, kafka=True)
