"""The example DAGs' configuration, read in one place.

`logbus_hourly_load`, `logbus_daily_audit` and `logbus_complete_hours` each call
`example_config()` when they are parsed, so the three always name the same topic, table,
target, catalog connection and schema: the daily audit checks the table the hourly load
writes, and the complete-hours DAG counts rows in it. (Before, each read the environment
on its own and the daily audit had no target at all: on Iceberg it audited a directory
table that did not exist.)

Every setting is an environment variable of the Airflow components that parse and run
the DAGs (scheduler, dag-processor, workers, triggerer); unset means the default:

| variable | default | meaning |
|---|---|---|
| LOGBUS_TOPIC | web_activity | the topic loaded |
| LOGBUS_TABLE | web_activity | the table (Iceberg: `[namespace.]name`, namespace `logbus`) |
| LOGBUS_TARGET | iceberg | `iceberg` (an Iceberg table) or `directory` (Parquet directories) |
| LOGBUS_WAREHOUSE | /tmp/logbus-warehouse | the directory target's root; the embedded Iceberg catalog's home |
| LOGBUS_CATALOG_CONN_ID | logbus_iceberg_default | the Iceberg catalog's connection; without it an embedded SQLite catalog under the warehouse |
| LOGBUS_VALUE_SCHEMA | the simulator's events | Spark DDL or a .json schema file; `infer` (directory target only) infers it from a sample |
| LOGBUS_VALUE_FORMAT | json | `json` (JSON values) or `confluent` (registry-framed Avro and JSON Schema values, docs/schemas.md) |
| LOGBUS_SCHEMA_SUBJECT | (none) | the table's schema is this registry subject's latest version (instead of LOGBUS_VALUE_SCHEMA); a `check_schema` task checks it against the table before the load |
| LOGBUS_REGISTRY_URL | (none) | an open schema registry's URL (comma-separated: several); it overrides the connection's URL |
| LOGBUS_REGISTRY_CONN_ID | logbus_schema_registry_default | the registry's `logbus_schema_registry` connection (HTTPS, Basic); unused when only LOGBUS_REGISTRY_URL is set |
| LOGBUS_CONN_ID | logbus_default | the logbus connection |
| LOGBUS_GROUP | warehouse_loader | the group the commit mirrors offsets into (lag monitoring) |
| LOGBUS_SENSOR_GRACE_MINUTES | 5 | late data the sensor waits for past an interval's end |
| LOGBUS_DEFERRABLE | false | the sensor waits in the triggerer |
| LOGBUS_ON_DATA_LOSS | fail | `fail` or `skip` bytes retention deleted before they were loaded |
| LOGBUS_MAX_BYTES_PER_PARTITION | (no cap) | bytes a run loads per partition at most |
| LOGBUS_MAX_REJECT_RATE | 1.0 | fail a load with more rejected values than this fraction (1.0: never) |
| LOGBUS_LEADER_WAIT_SECONDS | 60 | how long a load waits for a partition without a reachable leader |
| LOGBUS_RETRY_DELAY_SECONDS | 60 | the delay between a task's tries (2 retries) |
| LOGBUS_AUDIT_THRESHOLD | 0.999 | the completeness under which an audit fails |
| LOGBUS_AUDIT_GRACE_MINUTES | 60 | late data the hourly audit allows for before failing |
| LOGBUS_DAILY_AUDIT_GRACE_MINUTES | 120 | the same for the daily audit |

Iceberg is the examples' default because it is what the demo shows and what users query
(any engine reads the table through its catalog); `LOGBUS_TARGET=directory` switches the
three DAGs together. The operators themselves default to `target="directory"`
(docs/provider.md, "Targets").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from airflow_provider_logbus.cluster import LOAD_LEADER_WAIT_S
from airflow_provider_logbus.targets import KINDS

# What simulate_web_servers.event() sends, declared: an Iceberg table is created from a
# declared schema, never inferred from a sample.
WEB_ACTIVITY_SCHEMA = ("event_id string, server string, ts_ms bigint, user_id bigint, session string, "
                       "action string, page string, status int, latency_ms double")
INFER = "infer"  # LOGBUS_VALUE_SCHEMA: no declared schema (the directory target infers one per batch)
VALUE_FORMATS = ("json", "confluent")
DEFAULT_REGISTRY_CONN_ID = "logbus_schema_registry_default"  # SchemaRegistryHook's (not imported: parse-time cost)


class ExampleConfigError(ValueError):
    """An example setting is missing or malformed; the message names the variable."""


@dataclass(frozen=True)
class ExampleConfig:
    """The examples' settings (module docstring), parsed and checked."""

    topic: str = "web_activity"
    table: str = "web_activity"
    target: str = "iceberg"
    warehouse: str = "/tmp/logbus-warehouse"
    catalog_conn_id: str = "logbus_iceberg_default"
    value_schema: str | None = WEB_ACTIVITY_SCHEMA
    value_format: str = "json"
    schema_subject: str | None = None
    registry_url: str | None = None
    registry_conn_id: str | None = None
    logbus_conn_id: str = "logbus_default"
    group: str = "warehouse_loader"
    sensor_grace_minutes: float = 5.0
    deferrable: bool = False
    on_data_loss: str = "fail"
    max_bytes_per_partition: str | None = None
    max_reject_rate: float = 1.0
    leader_wait_seconds: float = LOAD_LEADER_WAIT_S
    retry_delay_seconds: float = 60.0
    audit_threshold: float = 0.999
    audit_grace_minutes: float = 60.0
    daily_audit_grace_minutes: float = 120.0

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "ExampleConfig":
        """The settings from `environ` (the process environment by default)."""
        env = Settings(os.environ if environ is None else environ)
        target = env.text("LOGBUS_TARGET", cls.target)
        if target not in KINDS:
            raise ExampleConfigError(f"LOGBUS_TARGET={target!r}: use one of {', '.join(KINDS)}")
        schema = env.text("LOGBUS_VALUE_SCHEMA", WEB_ACTIVITY_SCHEMA)
        if schema == INFER and target == "iceberg":
            raise ExampleConfigError("LOGBUS_VALUE_SCHEMA=infer needs LOGBUS_TARGET=directory: an Iceberg table is "
                                     "created from a declared schema (Spark DDL or a .json schema file)")
        value_format = env.text("LOGBUS_VALUE_FORMAT", cls.value_format)
        if value_format not in VALUE_FORMATS:
            raise ExampleConfigError(f"LOGBUS_VALUE_FORMAT={value_format!r}: use one of {', '.join(VALUE_FORMATS)}")
        subject = env.text("LOGBUS_SCHEMA_SUBJECT", "") or None
        if subject and env.text("LOGBUS_VALUE_SCHEMA", ""):
            raise ExampleConfigError(f"LOGBUS_SCHEMA_SUBJECT={subject!r} and LOGBUS_VALUE_SCHEMA are both set: the "
                                     "table's schema is the subject's latest version or the declared one, not both")
        on_data_loss = env.text("LOGBUS_ON_DATA_LOSS", cls.on_data_loss)
        if on_data_loss not in ("fail", "skip"):
            raise ExampleConfigError(f"LOGBUS_ON_DATA_LOSS={on_data_loss!r}: use fail or skip")
        deferrable = env.text("LOGBUS_DEFERRABLE", "false").lower()
        if deferrable not in ("true", "false"):
            raise ExampleConfigError(f"LOGBUS_DEFERRABLE={deferrable!r}: use true or false")
        return cls(
            topic=env.text("LOGBUS_TOPIC", cls.topic), table=env.text("LOGBUS_TABLE", cls.table), target=target,
            warehouse=env.text("LOGBUS_WAREHOUSE", cls.warehouse),
            catalog_conn_id=env.text("LOGBUS_CATALOG_CONN_ID", cls.catalog_conn_id),
            value_schema=None if schema == INFER or subject else schema,
            value_format=value_format, schema_subject=subject, **registry(env),
            logbus_conn_id=env.text("LOGBUS_CONN_ID", cls.logbus_conn_id), group=env.text("LOGBUS_GROUP", cls.group),
            sensor_grace_minutes=env.number("LOGBUS_SENSOR_GRACE_MINUTES", cls.sensor_grace_minutes),
            deferrable=deferrable == "true", on_data_loss=on_data_loss,
            max_bytes_per_partition=env.text("LOGBUS_MAX_BYTES_PER_PARTITION", "") or None,
            max_reject_rate=env.number("LOGBUS_MAX_REJECT_RATE", cls.max_reject_rate),
            leader_wait_seconds=env.number("LOGBUS_LEADER_WAIT_SECONDS", cls.leader_wait_seconds),
            retry_delay_seconds=env.number("LOGBUS_RETRY_DELAY_SECONDS", cls.retry_delay_seconds),
            audit_threshold=env.number("LOGBUS_AUDIT_THRESHOLD", cls.audit_threshold),
            audit_grace_minutes=env.number("LOGBUS_AUDIT_GRACE_MINUTES", cls.audit_grace_minutes),
            daily_audit_grace_minutes=env.number("LOGBUS_DAILY_AUDIT_GRACE_MINUTES", cls.daily_audit_grace_minutes),
        )

    def table_args(self) -> dict[str, Any]:
        """Where the table lives, for every operator that opens it (snapshot, load,
        commit, audit): the same four arguments in every example DAG."""
        return {"table": self.table, "warehouse": self.warehouse, "target": self.target,
                "catalog_conn_id": self.catalog_conn_id}

    def registry_args(self) -> dict[str, str | None]:
        """The schema registry, for the load and the schema check: none when neither
        decodes framed values nor reads a subject (a JSON load has no registry to reach)."""
        if self.value_format != "confluent" and not self.schema_subject:
            return {}
        return {"registry_url": self.registry_url, "registry_conn_id": self.registry_conn_id}


def registry(env: Settings) -> dict[str, str | None]:
    """The registry's URL and connection: the connection named, or the default one
    unless a URL alone is given (an open registry needs no connection)."""
    url = env.text("LOGBUS_REGISTRY_URL", "") or None
    conn_id = env.text("LOGBUS_REGISTRY_CONN_ID", "") or (None if url else DEFAULT_REGISTRY_CONN_ID)
    return {"registry_url": url, "registry_conn_id": conn_id}


class Settings:
    """Environment variables read as text or as numbers, an unparsable one named."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def text(self, name: str, default: str) -> str:
        value = self.environ.get(name, "").strip()
        return value or default

    def number(self, name: str, default: float) -> float:
        value = self.environ.get(name, "").strip()
        if not value:
            return default
        try:
            number = float(value)
        except ValueError:
            raise ExampleConfigError(f"{name}={value!r} is not a number") from None
        if number < 0:
            raise ExampleConfigError(f"{name}={value!r} must not be negative")
        return number


def example_config() -> ExampleConfig:
    """The configuration every example DAG uses, from the process environment."""
    return ExampleConfig.from_environment()
