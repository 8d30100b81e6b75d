"""Broker settings: one typed object, defaults in one place (STYLE: "the code below
never reads raw strings").

Sources, later ones winning: defaults < properties files < `--set key=value` and the
common flags. Unknown keys and bad values fail at start with a message that names
the key, the value and what was expected.

Passwords (`SECRET_KEYS`) belong in a properties file only the broker's user may read:
a command line is readable by every local user (`/proc/<pid>/cmdline`), so a file
holding one that others may read is refused, and one its group may read is warned
about.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from broker.common.listeners import DEFAULT_KAFKA_LISTENERS, DEFAULT_PROTOCOL_MAP

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DAY_MS = 24 * 3600 * 1000
SECRET_KEYS = frozenset({"zookeeper.auth", "inter.broker.sasl.password"})  # never shown, never on a command line

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A setting that is unknown or whose value cannot be used."""


def _setting(key: str, default: Any, parse: Callable[[str], Any], check: Callable[[Any], bool] | None = None, rule: str = ""):
    return field(default=default, metadata={"key": key, "parse": parse, "check": check, "rule": rule})


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    raise ValueError("expected true or false")


def _dirs(text: str) -> tuple[Path, ...]:
    dirs = tuple(Path(p.strip()) for p in text.split(",") if p.strip())
    if not dirs:
        raise ValueError("expected a comma-separated list of directories")
    return dirs


def _per_topic(text: str) -> tuple[tuple[str, int], ...]:
    """`topic:value,topic:value` (empty: no overrides), as (topic, value) pairs so the
    config stays immutable; `dict()` them to look up."""
    from broker.common.protocol import check_topic_name

    overrides = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        topic, sep, value = item.rpartition(":")
        if not sep:
            raise ValueError(f"expected topic:value, got {item!r}")
        try:
            check_topic_name(topic)
        except Exception as exc:
            raise ValueError(str(exc)) from None
        overrides[topic] = int(value)
    return tuple(sorted(overrides.items()))


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip().upper() for n in text.split(",") if n.strip())


_positive = (lambda v: v > 0, "must be > 0")
_non_negative = (lambda v: v >= 0, "must be >= 0")


@dataclass(frozen=True)
class BrokerConfig:
    broker_id: int = _setting("broker.id", -1, int, lambda v: v >= 0, "must be >= 0 (and is required)")
    host: str = _setting("host", "127.0.0.1", str)
    port: int = _setting("port", 9092, int, lambda v: 0 < v < 65536, "must be a TCP port 1-65535")
    log_dirs: tuple[Path, ...] = _setting("log.dirs", (Path("/tmp/logbus-logs"),), _dirs)
    zookeeper_connect: str = _setting("zookeeper.connect", "", str, bool, "is required (host:port[,host:port][/chroot])")
    zookeeper_session_timeout_ms: int = _setting("zookeeper.session.timeout.ms", 6000, int, *_positive)
    zookeeper_connection_timeout_ms: int = _setting("zookeeper.connection.timeout.ms", 10000, int, *_positive)
    zookeeper_reconnect_backoff_max_ms: int = _setting("zookeeper.reconnect.backoff.max.ms", 1000, int, *_positive)
    num_partitions: int = _setting("num.partitions", 1, int, *_positive)
    auto_create_topics: bool = _setting("auto.create.topics", True, _bool)
    delete_topic_enable: bool = _setting("delete.topic.enable", True, _bool)
    log_segment_bytes: int = _setting("log.segment.bytes", 1 * GiB, int, lambda v: v >= 1024, "must be >= 1024")
    log_roll_ms: int = _setting("log.roll.ms", 7 * DAY_MS, int, *_positive)
    log_flush_interval_messages: int = _setting("log.flush.interval.messages", 10_000, int, *_positive)
    log_flush_interval_ms: int = _setting("log.flush.interval.ms", 200, int, *_positive)
    log_retention_ms: int = _setting("log.retention.ms", 7 * DAY_MS, int, lambda v: v > 0 or v == -1, "must be > 0, or -1 for no limit")
    log_retention_bytes: int = _setting("log.retention.bytes", -1, int, lambda v: v > 0 or v == -1, "must be > 0, or -1 for no limit")
    log_retention_ms_per_topic: tuple[tuple[str, int], ...] = _setting(
        "log.retention.ms.per.topic", (), _per_topic, lambda m: all(v > 0 or v == -1 for _, v in m),
        "values must be > 0, or -1 for no limit",
    )
    log_retention_bytes_per_topic: tuple[tuple[str, int], ...] = _setting(
        "log.retention.bytes.per.topic", (), _per_topic, lambda m: all(v > 0 or v == -1 for _, v in m),
        "values must be > 0, or -1 for no limit",
    )
    log_retention_check_interval_ms: int = _setting("log.retention.check.interval.ms", 300_000, int, *_positive)
    # an idempotent producer id of which this broker appended nothing to a partition for
    # this long, by its own clock (never the messages' timestamps), is forgotten there at
    # the next retention check, roll or restart; its next batch, a retry included, starts
    # afresh and is appended (Kafka's producer.id.expiration.ms; docs/storage.md)
    producer_id_expiration_ms: int = _setting("producer.id.expiration.ms", DAY_MS, int,
                                              lambda v: v > 0 or v == -1, "must be > 0, or -1 to keep ids for ever")
    message_max_bytes: int = _setting("message.max.bytes", 1 * MiB, int, lambda v: v >= 64, "must be >= 64")
    message_max_decompressed_bytes: int = _setting(
        "message.max.decompressed.bytes", 64 * MiB, int, lambda v: v >= 1024, "must be >= 1024")
    log_open_files_max: int = _setting("log.open.files.max", 0, int, *_non_negative)
    log_dir_probe_interval_ms: int = _setting("log.dir.probe.interval.ms", 1000, int, *_positive)
    socket_request_max_bytes: int = _setting("socket.request.max.bytes", 100 * MiB, int, lambda v: v >= 1024, "must be >= 1024")
    connections_max_idle_ms: int = _setting("connections.max.idle.ms", 600_000, int, *_positive)
    request_read_timeout_ms: int = _setting("request.read.timeout.ms", 30_000, int, *_positive)
    fetch_max_wait_ms: int = _setting("fetch.max.wait.ms", 30_000, int, *_non_negative)
    max_in_flight_requests: int = _setting("max.in.flight.requests.per.connection", 100, int, *_positive)
    socket_send_buffer_max_bytes: int = _setting("socket.send.buffer.max.bytes", 1 * MiB, int, lambda v: v >= 64 * KiB, "must be >= 65536")
    # a frame before its connection authenticates (Kafka's name): SCRAM's are a few hundred
    # bytes; the bound keeps them in the connection's own buffer, out of the broker-wide budget
    sasl_server_max_receive_size: int = _setting("sasl.server.max.receive.size", 64 * KiB, int,
                                                 lambda v: 1 * KiB <= v <= 128 * KiB, "must be between 1024 and 131072")
    queued_max_request_bytes: int = _setting("queued.max.request.bytes", 128 * MiB, int, lambda v: v >= 1 * MiB, "must be >= 1048576")
    # replication (docs/replication.md)
    replica_lag_time_max_ms: int = _setting("replica.lag.time.max.ms", 10_000, int, *_positive)
    min_insync_replicas: int = _setting("min.insync.replicas", 1, int, *_positive)
    replica_fetch_max_bytes: int = _setting("replica.fetch.max.bytes", 1 * MiB, int, lambda v: v >= 1024, "must be >= 1024")
    replica_fetch_wait_max_ms: int = _setting("replica.fetch.wait.max.ms", 500, int, *_non_negative)
    default_replication_factor: int = _setting("default.replication.factor", 1, int, *_positive)
    unclean_leader_election_enable: bool = _setting("unclean.leader.election.enable", False, _bool)
    auto_leader_rebalance_enable: bool = _setting("auto.leader.rebalance.enable", True, _bool)
    leader_imbalance_check_interval_seconds: int = _setting(
        "leader.imbalance.check.interval.seconds", 300, int, *_positive)
    leader_imbalance_per_broker_percentage: int = _setting(
        "leader.imbalance.per.broker.percentage", 10, int, lambda v: 0 <= v <= 100, "must be between 0 and 100")
    replica_high_watermark_checkpoint_interval_ms: int = _setting(
        "replica.high.watermark.checkpoint.interval.ms", 5000, int, *_positive)
    # what the high watermark waits for (docs/replication.md, "Visibility"): every
    # in-sync follower's flushed end and the leader's log end (followers-flushed), or
    # the leader's flushed end too (all-flushed, the rule before issue 25)
    replica_visibility: str = _setting("replica.visibility", "followers-flushed", str,
                                       lambda v: v in ("followers-flushed", "all-flushed"),
                                       "must be followers-flushed or all-flushed")
    # the Kafka listener's group coordinator (docs/kafka.md, "Consumer groups"): Kafka's settings
    group_min_session_timeout_ms: int = _setting("group.min.session.timeout.ms", 6000, int, *_positive)
    group_max_session_timeout_ms: int = _setting("group.max.session.timeout.ms", 1_800_000, int, *_positive)
    group_initial_rebalance_delay_ms: int = _setting("group.initial.rebalance.delay.ms", 3000, int, *_non_negative)
    # the brokers' record counts, the audit's `broker` tier (broker.server.audit;
    # docs/operations.md, "The brokers' record counts"); interval 0: not counted
    audit_count_interval_ms: int = _setting("audit.count.interval.ms", 5000, int, *_non_negative)
    audit_count_max_bytes: int = _setting("audit.count.max.bytes", 64 * MiB, int, lambda v: v >= 1024, "must be >= 1024")
    audit_window_retention_ms: int = _setting("audit.window.retention.ms", 7 * DAY_MS, int, *_positive)
    audit_excluded_topics: tuple[str, ...] = _setting(
        "audit.excluded.topics", ("_logbus_monitoring", "_logbus_audit"),
        lambda t: tuple(n.strip() for n in t.split(",") if n.strip()))
    # security (docs/operations.md, "Securing a cluster"); empty listeners: PLAINTEXT://host:port
    listeners: str = _setting("listeners", "", str)
    advertised_listeners: str = _setting("advertised.listeners", "", str)
    listener_security_protocol_map: str = _setting("listener.security.protocol.map", DEFAULT_PROTOCOL_MAP, str)
    inter_broker_listener_name: str = _setting("inter.broker.listener.name", "", str)
    kafka_listener_names: str = _setting("kafka.listener.names", DEFAULT_KAFKA_LISTENERS, str)
    ssl_certfile: str = _setting("ssl.certfile", "", str)
    ssl_keyfile: str = _setting("ssl.keyfile", "", str)
    ssl_cafile: str = _setting("ssl.cafile", "", str)
    ssl_client_auth: str = _setting("ssl.client.auth", "none", str, lambda v: v in ("none", "requested", "required"),
                                    "must be none, requested or required")
    ssl_reload_interval_ms: int = _setting("ssl.reload.interval.ms", 60_000, int, *_positive)
    sasl_enabled_mechanisms: tuple[str, ...] = _setting(
        "sasl.enabled.mechanisms", ("SCRAM-SHA-256", "SCRAM-SHA-512"), _names,
        lambda v: bool(set(v) & {"SCRAM-SHA-256", "SCRAM-SHA-512"}) and set(v) <= {"SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"},
        "must name SCRAM-SHA-256 and/or SCRAM-SHA-512, and may add PLAIN (Kafka listeners with TLS only)")
    inter_broker_sasl_mechanism: str = _setting("inter.broker.sasl.mechanism", "SCRAM-SHA-256", str,
                                                lambda v: v in ("SCRAM-SHA-256", "SCRAM-SHA-512"),
                                                "must be SCRAM-SHA-256 or SCRAM-SHA-512")
    inter_broker_sasl_username: str = _setting("inter.broker.sasl.username", "", str)
    inter_broker_sasl_password: str = _setting("inter.broker.sasl.password", "", str)
    broker_principal: str = _setting("broker.principal", "", str)
    authorizer_enable: bool = _setting("authorizer.enable", False, _bool)
    super_users: tuple[str, ...] = _setting("super.users", (), lambda t: tuple(u.strip() for u in t.split(";") if u.strip()),
                                            lambda v: all(u.startswith("User:") for u in v),
                                            "must be User:<name> entries separated by ';'")
    allow_everyone_if_no_acl_found: bool = _setting("allow.everyone.if.no.acl.found", False, _bool)
    zookeeper_set_acl: bool = _setting("zookeeper.set.acl", False, _bool)
    zookeeper_auth: str = _setting("zookeeper.auth", "", str, lambda v: not v or ":" in v, "must be user:password")
    # TLS to ZooKeeper (its secureClientPort) when a CA is given
    zookeeper_ssl_cafile: str = _setting("zookeeper.ssl.cafile", "", str)
    zookeeper_ssl_certfile: str = _setting("zookeeper.ssl.certfile", "", str)
    zookeeper_ssl_keyfile: str = _setting("zookeeper.ssl.keyfile", "", str)

    def __repr__(self) -> str:  # never print a password (start-up logs, tracebacks)
        def shown(f: dataclasses.Field) -> str:
            value = getattr(self, f.name)
            return "***" if f.metadata["key"] in SECRET_KEYS and value else repr(value)

        return f"BrokerConfig({', '.join(f'{f.name}={shown(f)}' for f in dataclasses.fields(self))})"

    @classmethod
    def keys(cls) -> dict[str, dataclasses.Field]:
        return {f.metadata["key"]: f for f in dataclasses.fields(cls)}

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> "BrokerConfig":
        """Build from `key -> text`; every problem is reported at once."""
        known = cls.keys()
        aliases = {"log.dir": "log.dirs"}
        values: dict[str, Any] = {}
        problems = []
        for key, text in settings.items():
            key = aliases.get(key, key)
            f = known.get(key)
            if f is None:
                problems.append(f"unknown setting {key!r}")
                continue
            try:
                value = f.metadata["parse"](str(text).strip())
            except ValueError as exc:
                problems.append(f"{key}={text!r}: {exc}")
                continue
            values[f.name] = value
        config = cls(**values)
        for key, f in known.items():
            check = f.metadata["check"]
            value = getattr(config, f.name)
            if check is not None and not check(value):
                problems.append(f"{key}={value!r} {f.metadata['rule']}")
        if not problems:
            from broker.server.auth.listeners import check_security

            problems += check_security(config)
        if problems:
            raise ConfigError("bad broker configuration:\n  " + "\n  ".join(problems))
        return config


def read_properties(path: Path) -> dict[str, str]:
    """Java-style `key=value` lines; `#` and `!` start comments. A file that holds a
    password must be private (`check_private`)."""
    settings: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, sep, value = line.partition(":")
        if not sep:
            raise ConfigError(f"{path}:{number}: expected key=value, got {line!r}")
        settings[key.strip()] = value.strip()
    check_private(Path(path), settings)
    return settings


def check_private(path: Path, settings: Mapping[str, str]) -> None:
    """Refuse a file with passwords that every local user may read; warn when its group
    may (a deliberate service group is fine, an accidental one is not)."""
    held = ", ".join(sorted(SECRET_KEYS & settings.keys()))
    mode = path.stat().st_mode & 0o777
    if held and mode & 0o004:
        raise ConfigError(f"{path} holds {held} and every local user may read it (mode {mode:04o}): chmod 600 {path}")
    if held and mode & 0o040:
        logger.warning("%s holds %s and its group may read it (mode %04o): chmod 600 %s unless that group is the "
                       "broker's alone", path, held, mode, path)


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        settings[key.strip()] = value
    return settings
