"""Declared value schemas (`ValueSchema`): what the fields of a topic's JSON values are, fixed once
instead of re-inferred from a sample for every batch.

A schema is written as a Spark DDL string::

    server string, n long, ts_ms long NOT NULL, tags array<string>, geo struct<lat: double, lon: double>

or kept in a JSON file (a path ending in ``.json``), JSON-Schema style::

    {"type": "object", "properties": {"n": {"type": "integer"}, ...}, "required": ["n"]}

or Avro-record style::

    {"type": "record", "name": "event", "fields": [{"name": "n", "type": ["null", "long"]}, ...]}

Internally a schema is a `pyarrow.Schema` of the value fields (nullable unless
required), so the Parquet/Iceberg side and the Spark side (`to_ddl()`, for
`from_json`) are derived from one description. `check_evolution` says whether a
table written with one schema may be written with another.

Pure Python (pyarrow only): no Spark, no Airflow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_provider_logbus.schema.avro import _avro_type
from airflow_provider_logbus.schema.ddl import _DdlParser, _ddl_field, ddl_type
from airflow_provider_logbus.schema.json_schema import _json_schema_type
from airflow_provider_logbus.schema.types import SchemaError


@dataclass(frozen=True)
class ValueSchema:
    """The value fields of a topic. `source` says where it came from (for messages)."""

    arrow: pa.Schema
    source: str = "<schema>"

    @classmethod
    def from_ddl(cls, ddl: str) -> "ValueSchema":
        return cls(_DdlParser(ddl).schema(), source="DDL")

    @classmethod
    def from_json_file(cls, path: str | Path) -> "ValueSchema":
        path = Path(path)
        try:
            document = json.loads(path.read_text())
        except FileNotFoundError:
            raise SchemaError(f"schema file {path} does not exist") from None
        except json.JSONDecodeError as e:
            raise SchemaError(f"schema file {path} is not valid JSON: {e.msg} at line {e.lineno} "
                              f"column {e.colno} (position {e.pos})") from None
        return cls(_schema_from_document(document, str(path)), source=str(path))

    @classmethod
    def from_document(cls, document: dict, source: str = "<json schema>",
                      avro_defaults_optional: bool = False) -> "ValueSchema":
        """A JSON-Schema or Avro-record document already loaded; `avro_defaults_optional`:
        an Avro field with a default is optional too (a registry subject's versions,
        `schema/registry.py`)."""
        return cls(_schema_from_document(document, source, avro_defaults_optional), source=source)

    @classmethod
    def from_arrow(cls, schema: pa.Schema, source: str = "arrow") -> "ValueSchema":
        for f in schema:
            ddl_type(f.type)  # refuses types the DDL cannot say
        return cls(schema, source=source)

    def to_arrow(self) -> pa.Schema:
        return self.arrow

    def to_ddl(self) -> str:
        """Spark DDL (for `from_json` and `StructType.fromDDL`); `from_ddl(to_ddl())` gives
        the same schema back."""
        return ", ".join(_ddl_field(f, top=True) for f in self.arrow)

    @property
    def names(self) -> list[str]:
        return list(self.arrow.names)

    @property
    def required(self) -> list[str]:
        return [f.name for f in self.arrow if not f.nullable]

    def __str__(self) -> str:
        return self.to_ddl()


def load_schema(spec: str | Path) -> ValueSchema:
    """A DDL string, or the path of a JSON schema file (ending in `.json`)."""
    text = str(spec).strip()
    if text.lower().endswith(".json"):
        return ValueSchema.from_json_file(text)
    return ValueSchema.from_ddl(text)


def _schema_from_document(document: Any, source: str, avro_defaults_optional: bool = False) -> pa.Schema:
    if not isinstance(document, dict):
        raise SchemaError(f"{source}: a schema document is a JSON object, found {type(document).__name__}")
    try:
        if document.get("type") == "record" or "fields" in document:
            struct = _avro_type(document, "", avro_defaults_optional)
        elif document.get("type") == "object" or "properties" in document:
            struct = _json_schema_type(document, "", required=False)[0]
        else:
            struct = None
    except SchemaError as e:
        raise SchemaError(f"{source}: {e}") from None
    if struct is None:
        raise SchemaError(f"{source}: expected a JSON Schema object ({{\"type\": \"object\", \"properties\": ...}}) "
                          f"or an Avro record ({{\"type\": \"record\", \"fields\": [...]}}), found type "
                          f"{document.get('type')!r}")
    if struct.num_fields == 0:
        raise SchemaError(f"{source}: the schema declares no fields")
    return pa.schema([struct.field(i) for i in range(struct.num_fields)])
