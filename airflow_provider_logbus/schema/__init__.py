"""Declared value schemas (docs/provider.md, "Schemas"): one module per format —
`ddl` (Spark DDL, both ways), `json_schema` and `avro` (schema documents read into
Arrow), `evolution` (what a table may take), `value` (`ValueSchema`, `load_schema`),
`types` (what they share), and `registry` (a schema registry subject's latest version
as a declared schema). Pure Python (pyarrow, urllib): no Spark, no Airflow."""

from airflow_provider_logbus.schema.ddl import ddl_type
from airflow_provider_logbus.schema.evolution import check_evolution
from airflow_provider_logbus.schema.types import SchemaError
from airflow_provider_logbus.schema.value import ValueSchema, load_schema

__all__ = ["SchemaError", "ValueSchema", "load_schema", "check_evolution", "ddl_type"]
