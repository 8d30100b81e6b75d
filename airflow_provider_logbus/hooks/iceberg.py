"""IcebergCatalogHook: the Iceberg catalog an Iceberg target commits through.

Connection type `logbus_iceberg` (default id `logbus_iceberg_default`):

* Catalog URI (host field, or extra `uri`): `sqlite:////var/lib/logbus/catalog.db`,
  `postgresql+psycopg2://user:pw@db:5432/iceberg` (the production setup), or a REST
  catalog's `https://...` with extra `{"type": "rest"}`;
* extra `warehouse`: where table data goes (`file:///data/wh`, `s3://bucket/wh`);
* extra `aws_conn_id`: an Airflow connection of the Amazon provider's `aws` type
  (login = access key id, password = secret access key, extras `region_name`,
  `endpoint_url` and `aws_session_token`), read as a plain connection (the Amazon provider
  is not needed) and turned into pyiceberg's `s3.*` properties, which the load job's
  executors get too (`storage.py`); `s3.*` extras set here win over it;
* any other extra is passed to pyiceberg's `load_catalog` as a catalog property
  (`credential`, `token`, `s3.endpoint`, ...).

Without the default connection, an embedded SQL catalog on a SQLite file under the
operator's `warehouse` path is used (no server to run; the demo's setup).
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import AirflowException, AirflowNotFoundException, BaseHook

from airflow_provider_logbus.connections import ICEBERG

DEFAULT_CONN_ID = "logbus_iceberg_default"


class IcebergCatalogHook(BaseHook):
    conn_name_attr = "catalog_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "logbus_iceberg"
    hook_name = "Logbus Iceberg catalog"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return ICEBERG.ui_field_behaviour()

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        return ICEBERG.form_widgets()

    def __init__(self, catalog_conn_id: str = DEFAULT_CONN_ID) -> None:
        super().__init__()
        self.catalog_conn_id = catalog_conn_id

    def catalog_properties(self, warehouse: str | None = None) -> dict[str, Any] | None:
        """pyiceberg catalog properties from the connection; None (embedded SQLite
        catalog under `warehouse`) when the default connection is not defined."""
        try:
            conn = self.get_connection(self.catalog_conn_id)
        except AirflowNotFoundException:
            if self.catalog_conn_id == DEFAULT_CONN_ID and warehouse:
                self.log.info("no connection %r: using the embedded SQLite Iceberg catalog under %s",
                              self.catalog_conn_id, warehouse)
                return None
            raise AirflowException(
                f"Airflow connection {self.catalog_conn_id!r} is not defined: create a connection of type "
                "'logbus_iceberg' with the catalog URI as host (e.g. postgresql+psycopg2://user@db/iceberg) and "
                "extra {\"warehouse\": \"file:///data/wh\"}, or give the operator a warehouse path for the "
                "embedded catalog") from None
        if conn.conn_type and conn.conn_type != "logbus_iceberg":
            raise AirflowException(f"Airflow connection {self.catalog_conn_id!r} has type {conn.conn_type!r}, "
                                   "expected 'logbus_iceberg'")
        props = dict(conn.extra_dejson or {})
        uri = props.pop("uri", None) or conn.host
        if not uri:
            raise AirflowException(f"Airflow connection {self.catalog_conn_id!r} names no catalog: set its host "
                                   "(or extra 'uri') to the catalog URI")
        aws_conn_id = props.pop("aws_conn_id", None)
        if aws_conn_id:
            props = {**self.s3_properties(aws_conn_id), **props}
        props.setdefault("type", "rest" if uri.startswith(("http://", "https://")) else "sql")
        props["uri"] = uri
        if "warehouse" not in props and warehouse:
            props["warehouse"] = warehouse if "://" in warehouse else f"file://{warehouse}"
        return props

    def s3_properties(self, aws_conn_id: str) -> dict[str, str]:
        """pyiceberg's `s3.*` properties from an `aws` connection (module docstring)."""
        try:
            conn = self.get_connection(aws_conn_id)
        except AirflowNotFoundException:
            raise AirflowException(f"Airflow connection {aws_conn_id!r} (the catalog connection "
                                   f"{self.catalog_conn_id!r}'s aws_conn_id) is not defined") from None
        extra = conn.extra_dejson or {}
        endpoint = (extra.get("endpoint_url")
                    or (extra.get("service_config") or {}).get("s3", {}).get("endpoint_url"))
        found = {"s3.access-key-id": conn.login, "s3.secret-access-key": conn.password,
                 "s3.session-token": extra.get("aws_session_token"), "s3.region": extra.get("region_name"),
                 "s3.endpoint": endpoint}
        return {k: str(v) for k, v in found.items() if v}

    def test_connection(self) -> tuple[bool, str]:
        try:
            from pyiceberg.catalog import load_catalog

            props = self.catalog_properties()
            catalog = load_catalog("logbus", **{k: str(v) for k, v in (props or {}).items()})
            return True, f"{len(catalog.list_namespaces())} namespace(s)"
        except Exception as exc:  # test_connection reports, never raises
            return False, f"{type(exc).__name__}: {exc}"
