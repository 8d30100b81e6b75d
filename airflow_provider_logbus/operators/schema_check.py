"""LogbusSchemaCheckOperator: fails a DAG run early when a registry subject's latest
version is one the table cannot take (docs/schemas.md, "Loads")."""

from __future__ import annotations

from typing import Any, Sequence

from airflow.providers.common.compat.sdk import AirflowException, BaseOperator

from airflow_provider_logbus.operators.target import DEFAULT_CATALOG_CONN_ID, resolve_target


class LogbusSchemaIncompatibleError(AirflowException):
    """The subject's latest version breaks the table's schema; the message names the
    version, the table, the field and both types."""


class LogbusSchemaCheckOperator(BaseOperator):
    """Checks `schema_subject`'s latest version (in the registry of `registry_conn_id`, a
    `logbus_schema_registry` connection, or at `registry_url`)
    against `table`'s current schema by the rules a load evolves the table with
    (`schema.check_evolution`): new optional fields — Avro fields that are nullable or
    have a default — would become columns; a changed type that is not a widening, a new
    required field (no default), or an optional field made required fail the task with
    `LogbusSchemaIncompatibleError` before the load starts Spark. Run it before the load
    (or in a producer's own DAG, before its rollout). Returns (XCom) {"subject",
    "version", "schema_id", "columns_to_add"}. A table that does not exist yet takes
    any subject that has a table form.

    `target` and `catalog_conn_id` (or `warehouse`) as the load's. The Iceberg target
    compares with the table's columns; the directory target with the declared schema its
    latest batch recorded."""

    template_fields: Sequence[str] = ("table", "warehouse", "target", "registry_url", "registry_conn_id",
                                      "schema_subject")

    def __init__(self, *, table: str, schema_subject: str, registry_url: str | None = None,
                 registry_conn_id: str | None = None, warehouse: str | None = None, target: str = "directory",
                 catalog_conn_id: str = DEFAULT_CATALOG_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.table, self.schema_subject, self.registry_url = table, schema_subject, registry_url
        self.registry_conn_id = registry_conn_id
        self.warehouse, self.target, self.catalog_conn_id = warehouse, target, catalog_conn_id

    def execute(self, context) -> dict:
        from airflow_provider_logbus.hooks.registry import registry_access
        from airflow_provider_logbus.schema import SchemaError
        from airflow_provider_logbus.schema.registry import latest_version

        try:
            version = latest_version(registry_access(self.registry_url, self.registry_conn_id), self.schema_subject)
        except SchemaError as exc:
            raise LogbusSchemaIncompatibleError(str(exc)) from None
        target = resolve_target(self.target, self.table, warehouse=self.warehouse,
                                catalog_conn_id=self.catalog_conn_id)
        try:
            added = target.check_schema(version.value_schema.to_arrow())
        except SchemaError as exc:
            raise LogbusSchemaIncompatibleError(
                f"{version.describe()} is incompatible with table {self.table!r}: {exc}. The next load would refuse "
                "it: register a compatible version (or evolve the table by hand) first") from None
        finally:
            target.close()
        self.log.info("%s fits table %r: %s", version.describe(), self.table,
                      f"the next load adds {', '.join(added)}" if added else "no column to add")
        return {"subject": version.subject, "version": version.version, "schema_id": version.schema_id,
                "columns_to_add": added}
