"""The provider's connection forms, declared once.

Airflow 3.2+ builds the connection form from the provider info (`get_provider_info`):
`ui-field-behaviour` hides, relabels and fills in placeholders for the standard fields,
and `conn-fields` adds the custom fields (JSON Schema, stored in the connection's
extra). It no longer calls the hooks' `get_ui_field_behaviour` /
`get_connection_form_widgets` when the provider info has them; the hooks still answer
them, derived from the same declaration, for tools that ask the hook directly.

No Airflow import here: the provider info is read without importing hooks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ConnectionForm:
    """One connection type's form: the standard fields' behaviour and the custom fields
    (`conn-fields` form: {name: {"label", "description", "schema"}})."""

    conn_type: str
    hook_name: str
    hook_class: str
    hidden_fields: tuple[str, ...]
    relabeling: dict[str, str]
    placeholders: dict[str, str]
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)

    def ui_field_behaviour(self) -> dict[str, Any]:
        return {"hidden-fields": list(self.hidden_fields), "relabeling": dict(self.relabeling),
                "placeholders": dict(self.placeholders)}

    def provider_info(self) -> dict[str, Any]:
        """The `connection-types` entry of the provider info."""
        return {"hook-class-name": self.hook_class, "connection-type": self.conn_type, "hook-name": self.hook_name,
                "ui-field-behaviour": self.ui_field_behaviour(), "conn-fields": self.fields}

    def form_widgets(self) -> dict[str, Any]:
        """The same custom fields as Flask-AppBuilder widgets (the pre-3.2 form); {} when
        the FAB stack is not installed."""
        try:
            from flask_appbuilder.fieldwidgets import BS3TextFieldWidget
            from flask_babel import lazy_gettext
            from wtforms import BooleanField, IntegerField, StringField
            from wtforms.validators import Optional
        except ImportError:
            return {}
        widgets = {}
        for name, spec in self.fields.items():
            types = spec["schema"]["type"]
            kind = IntegerField if "integer" in types else BooleanField if "boolean" in types else StringField
            widgets[name] = kind(lazy_gettext(spec["label"]), widget=BS3TextFieldWidget(),
                                 description=spec.get("description", ""), default=spec["schema"].get("default"),
                                 validators=[Optional()])
        return widgets


def _optional(kind: str, label: str, description: str, default: Any = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": [kind, "null"]}
    if default is not None:
        schema["default"] = default
    return {"label": label, "description": description, "schema": schema}


LOGBUS = ConnectionForm(
    conn_type="logbus", hook_name="Logbus", hook_class="airflow_provider_logbus.hooks.logbus.LogbusHook",
    hidden_fields=(),
    relabeling={"host": "ZooKeeper host", "port": "ZooKeeper port", "schema": "ZooKeeper chroot",
                "login": "SASL username", "password": "SASL password"},
    placeholders={"host": "127.0.0.1", "port": "2181", "schema": "logbus (optional chroot)",
                  "extra": '{"zookeeper": "zk1:2181,zk2:2181/logbus"} or {"brokers": "b1:9092,b2:9092"}, '
                           '"timeout": 15'},
    fields={
        "zookeeper": _optional("string", "ZooKeeper connect string", "h1:2181,h2:2181/chroot (overrides host/port)"),
        "brokers": _optional("string", "Static brokers",
                             "h:9092,h:9093 when ZooKeeper is not reachable (no group offsets then)"),
        "timeout": _optional("integer", "Timeout (s)", "ZooKeeper and broker requests, in seconds", 15),
        # a secured cluster (docs/provider.md, "A secured cluster"); the password is the
        # connection's own secret field, the private key a field Airflow masks by name
        "security_protocol": _optional("string", "Security protocol",
                                       "PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL"),
        "listener": _optional("string", "Listener name", "the brokers' listener to reach, e.g. CLIENT"),
        "sasl_mechanism": _optional("string", "SASL mechanism", "SCRAM-SHA-256 (default) or SCRAM-SHA-512"),
        "ssl_cafile": _optional("string", "CA certificate file", "PEM path on every worker (or paste below)"),
        "ssl_ca_pem": _optional("string", "CA certificate (PEM)", "the CA's PEM text, instead of a file"),
        "ssl_certfile": _optional("string", "Client certificate file", "PEM path, for mTLS"),
        "ssl_cert_pem": _optional("string", "Client certificate (PEM)", "PEM text, for mTLS"),
        "ssl_keyfile": _optional("string", "Client key file", "PEM path, for mTLS"),
        "ssl_private_key": _optional("string", "Client key (PEM)", "PEM text, for mTLS (masked like a password)"),
        "zookeeper_ssl_cafile": _optional("string", "ZooKeeper CA file",
                                          "reach ZooKeeper over TLS (its secure port), checked against this CA"),
    },
)

ICEBERG = ConnectionForm(
    conn_type="logbus_iceberg", hook_name="Logbus Iceberg catalog",
    hook_class="airflow_provider_logbus.hooks.iceberg.IcebergCatalogHook",
    hidden_fields=("schema", "port", "login", "password"),
    relabeling={"host": "Catalog URI"},
    placeholders={
        "host": "postgresql+psycopg2://user:pw@db:5432/iceberg, sqlite:////path/catalog.db or https://rest-catalog",
        "extra": '{"warehouse": "file:///data/warehouse"} (+ any pyiceberg catalog property)',
    },
    fields={
        "warehouse": _optional("string", "Warehouse location", "file:///data/wh, s3://bucket/wh, ..."),
        "type": _optional("string", "Catalog type", "sql (default) or rest", "sql"),
        "aws_conn_id": _optional("string", "AWS connection", "an 'aws' connection with the object store's keys, "
                                 "region and endpoint (for an s3:// warehouse)"),
    },
)

SCHEMA_REGISTRY = ConnectionForm(
    conn_type="logbus_schema_registry", hook_name="Logbus schema registry",
    hook_class="airflow_provider_logbus.hooks.registry.SchemaRegistryHook",
    hidden_fields=("schema",),
    relabeling={"host": "Registry URL", "login": "Username", "password": "Password"},
    placeholders={"host": "https://registry1:8081,https://registry2:8081 (or a host name, with the port below)",
                  "login": "HTTP Basic user (a secured registry: docs/schemas.md)",
                  "extra": '{"ssl_cafile": "/etc/logbus/ca.pem"}'},
    fields={
        "ssl_cafile": _optional("string", "CA certificate file",
                                "PEM path on every worker: the registry's HTTPS certificate is checked against it"),
    },
)

FORMS = (LOGBUS, ICEBERG, SCHEMA_REGISTRY)
