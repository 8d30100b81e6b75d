"""SchemaRegistryHook: how a load (and any DAG-side check) reaches a schema registry
(docs/schemas.md, "Loads").

Connection type `logbus_schema_registry` (default id `logbus_schema_registry_default`):

* Registry URL (host): `https://registry:8081`, or several comma-separated (tried in
  turn); a bare host name takes the port field and `https` when a CA file is set, else
  `http`;
* Username / Password: HTTP Basic, for a registry run with `--authenticate basic`;
* extra `ssl_cafile`: the CA the registry's HTTPS certificate is checked against.

`client_config()` is confluent_kafka's `SchemaRegistryClient` configuration; the load
passes its credentials to the Spark job in the job's environment, never its arguments.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import AirflowException, BaseHook

from airflow_provider_logbus.connections import SCHEMA_REGISTRY
from airflow_provider_logbus.registry_access import RegistryAccess


def registry_access(registry_url: str | None, registry_conn_id: str | None) -> RegistryAccess:
    """The registry of an operator's `registry_conn_id` (URL, CA, Basic credentials), its
    URL overridden by `registry_url` when both are given; an open registry at
    `registry_url` without a connection."""
    if not registry_conn_id:
        return RegistryAccess(registry_url or "")
    return SchemaRegistryHook(registry_conn_id).access(registry_url)


class SchemaRegistryHook(BaseHook):
    conn_name_attr = "registry_conn_id"
    default_conn_name = "logbus_schema_registry_default"
    conn_type = "logbus_schema_registry"
    hook_name = "Logbus schema registry"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return SCHEMA_REGISTRY.ui_field_behaviour()

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        return SCHEMA_REGISTRY.form_widgets()

    def __init__(self, registry_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.registry_conn_id = registry_conn_id

    def client_config(self) -> dict[str, str]:
        """{"url", "basic.auth.user.info"?, "ssl.ca.location"?}: the connection as
        confluent_kafka's `SchemaRegistryClient` takes it (the password included: for
        clients, never for logs or XCom)."""
        conn = self.get_connection(self.registry_conn_id)
        if conn.conn_type and conn.conn_type != self.conn_type:
            raise AirflowException(f"Airflow connection {self.registry_conn_id!r} has type {conn.conn_type!r}, "
                                   f"expected {self.conn_type!r}")
        cafile = (conn.extra_dejson or {}).get("ssl_cafile")
        host = (conn.host or "").strip()
        if not host:
            raise AirflowException(f"Airflow connection {self.registry_conn_id!r} names no registry: set its host "
                                   f"to the registry's URL, e.g. https://registry:8081")
        if "://" not in host:
            host = f"{'https' if cafile else 'http'}://{host}{f':{conn.port}' if conn.port else ''}"
        config = {"url": host}
        if conn.login:
            config["basic.auth.user.info"] = f"{conn.login}:{conn.password or ''}"
        if cafile:
            config["ssl.ca.location"] = str(cafile)
        return config

    def access(self, url: str | None = None) -> RegistryAccess:
        """How the provider's own requests reach the registry (`url` overrides the
        connection's)."""
        config = self.client_config()
        return RegistryAccess.from_properties(url or config["url"], config)

    def test_connection(self) -> tuple[bool, str]:
        try:
            access = self.access()
            access.check()
            return True, f"schema registry {access.url} answers"
        except Exception as exc:  # test_connection reports, never raises
            return False, f"{type(exc).__name__}: {exc}"
