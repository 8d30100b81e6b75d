"""The broker's and a topic's settings under their Kafka names (docs/kafka.md,
"DescribeConfigs"), for DescribeConfigs and for CreateTopics' configs.

logbus has no per-topic configuration of its own: every topic has the broker's
settings, except retention, which `log.retention.ms.per.topic` /
`log.retention.bytes.per.topic` in the brokers' configuration may set per topic. So a
topic's configs are read-only and derived here from the broker's `BrokerConfig` and
the topic's `LogConfig` (`LogManager.config_for`, the one the topic's logs are opened
with); `cleanup.policy` is always `delete` (logbus does not compact).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable, NamedTuple

from broker.server.config import BrokerConfig
from broker.server.log.log import LogConfig


class ConfigType(enum.IntEnum):
    """Kafka's `ConfigEntry.ConfigType` (DescribeConfigs v3+)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    LIST = 7


class ConfigSource(enum.IntEnum):
    """Kafka's `ConfigEntry.ConfigSource`: where a value comes from."""

    STATIC_BROKER_CONFIG = 4  # set in the broker's configuration
    DEFAULT_CONFIG = 5  # the default


class ConfigValue(NamedTuple):
    name: str
    value: str
    type: ConfigType
    source: ConfigSource


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


# Kafka name -> (logbus's key, its type). Passwords and ZooKeeper credentials never.
BROKER_KEYS: dict[str, tuple[str, ConfigType]] = {
    "broker.id": ("broker.id", ConfigType.INT),
    "log.dirs": ("log.dirs", ConfigType.STRING),
    "num.partitions": ("num.partitions", ConfigType.INT),
    "auto.create.topics.enable": ("auto.create.topics", ConfigType.BOOLEAN),
    "delete.topic.enable": ("delete.topic.enable", ConfigType.BOOLEAN),
    "default.replication.factor": ("default.replication.factor", ConfigType.INT),
    "min.insync.replicas": ("min.insync.replicas", ConfigType.INT),
    "unclean.leader.election.enable": ("unclean.leader.election.enable", ConfigType.BOOLEAN),
    "auto.leader.rebalance.enable": ("auto.leader.rebalance.enable", ConfigType.BOOLEAN),
    "message.max.bytes": ("message.max.bytes", ConfigType.INT),
    "log.segment.bytes": ("log.segment.bytes", ConfigType.INT),
    "log.roll.ms": ("log.roll.ms", ConfigType.LONG),
    "log.retention.ms": ("log.retention.ms", ConfigType.LONG),
    "log.retention.bytes": ("log.retention.bytes", ConfigType.LONG),
    "log.retention.check.interval.ms": ("log.retention.check.interval.ms", ConfigType.LONG),
    "log.flush.interval.messages": ("log.flush.interval.messages", ConfigType.LONG),
    "log.flush.interval.ms": ("log.flush.interval.ms", ConfigType.LONG),
    "producer.id.expiration.ms": ("producer.id.expiration.ms", ConfigType.INT),
    "replica.lag.time.max.ms": ("replica.lag.time.max.ms", ConfigType.LONG),
    "replica.fetch.max.bytes": ("replica.fetch.max.bytes", ConfigType.INT),
    "socket.request.max.bytes": ("socket.request.max.bytes", ConfigType.INT),
    "connections.max.idle.ms": ("connections.max.idle.ms", ConfigType.LONG),
    "sasl.enabled.mechanisms": ("sasl.enabled.mechanisms", ConfigType.LIST),
    "listeners": ("listeners", ConfigType.STRING),
    "advertised.listeners": ("advertised.listeners", ConfigType.STRING),
    "listener.security.protocol.map": ("listener.security.protocol.map", ConfigType.STRING),
    "inter.broker.listener.name": ("inter.broker.listener.name", ConfigType.STRING),
}

_FIELDS = {f.metadata["key"]: f for f in dataclasses.fields(BrokerConfig)}


def broker_configs(config: BrokerConfig) -> list[ConfigValue]:
    """The broker's settings that have a Kafka name, each marked set or default."""
    values = []
    for name, (key, kind) in BROKER_KEYS.items():
        f = _FIELDS[key]
        value = getattr(config, f.name)
        source = ConfigSource.DEFAULT_CONFIG if value == f.default else ConfigSource.STATIC_BROKER_CONFIG
        values.append(ConfigValue(name, _text(value), kind, source))
    return values


# topic config -> (the broker setting it follows, its type, its value for a topic)
_TOPIC_KEYS: dict[str, tuple[str, ConfigType, Callable[[BrokerConfig, LogConfig], object]]] = {
    "cleanup.policy": ("", ConfigType.LIST, lambda c, log: "delete"),
    "retention.ms": ("log.retention.ms", ConfigType.LONG, lambda c, log: log.retention_ms),
    "retention.bytes": ("log.retention.bytes", ConfigType.LONG, lambda c, log: log.retention_bytes),
    "max.message.bytes": ("message.max.bytes", ConfigType.INT, lambda c, log: c.message_max_bytes),
    "segment.bytes": ("log.segment.bytes", ConfigType.INT, lambda c, log: log.segment_bytes),
    "segment.ms": ("log.roll.ms", ConfigType.LONG, lambda c, log: log.roll_ms),
    "flush.messages": ("log.flush.interval.messages", ConfigType.LONG, lambda c, log: log.flush_interval_messages),
    "flush.ms": ("log.flush.interval.ms", ConfigType.LONG, lambda c, log: log.flush_interval_ms),
    "min.insync.replicas": ("min.insync.replicas", ConfigType.INT, lambda c, log: c.min_insync_replicas),
    "unclean.leader.election.enable": ("unclean.leader.election.enable", ConfigType.BOOLEAN,
                                       lambda c, log: c.unclean_leader_election_enable),
}
TOPIC_KEYS = tuple(_TOPIC_KEYS)


def topic_configs(config: BrokerConfig, log: LogConfig) -> list[ConfigValue]:
    """A topic's effective settings: the broker's, with its retention overrides; a value
    different from Kafka's default of the broker setting it follows is marked set."""
    values = []
    for name, (key, kind, value_of) in _TOPIC_KEYS.items():
        value = value_of(config, log)
        default = _FIELDS[key].default if key else value
        source = ConfigSource.DEFAULT_CONFIG if value == default else ConfigSource.STATIC_BROKER_CONFIG
        values.append(ConfigValue(name, _text(value), kind, source))
    return values


def refused_topic_config(name: str, value: str | None, effective: dict[str, str]) -> str | None:
    """Why CreateTopics may not set `name=value` (None: it may, being what the topic
    gets anyway): logbus cannot give one topic settings of its own at creation."""
    if name not in effective:
        return (f"unknown topic config {name!r}: logbus topics have {', '.join(TOPIC_KEYS)}, "
                "set by the brokers' configuration")
    if value is None or value == effective[name]:
        return None
    if name == "cleanup.policy":
        return f"{name}={value}: logbus does not compact; every topic has cleanup.policy=delete"
    where = (f"log.{name}.per.topic" if name in ("retention.ms", "retention.bytes") else _TOPIC_KEYS[name][0])
    return (f"{name}={value}: logbus does not set topic configs at creation; this topic would have "
            f"{name}={effective[name]} (from {where} in the brokers' configuration)")
