"""Avro record documents (`{"type": "record", "fields": [...]}`) read into Arrow types."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from airflow_provider_logbus.schema.types import LOCAL_TIMESTAMP, SchemaError, UTC_TIMESTAMP, _decimal


_AVRO_PRIMITIVES = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
                    "double": pa.float64(), "bytes": pa.binary(), "string": pa.string()}


def _avro_type(node: Any, path: str, defaults_optional: bool = False) -> pa.DataType:
    """The arrow type of an Avro type at `path` (dotted field names; "" at the top).
    A record field is optional when its type is a union with "null" — and, with
    `defaults_optional` (a registry subject's schema, `schema/registry.py`), also when it
    has a default: a reader fills a missing field with its default, so a version may
    add one, but the table's rows loaded before it have no value there."""
    if isinstance(node, str):
        if node in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[node]
        raise SchemaError(f"{path or 'the record'}: unknown or unsupported Avro type {node!r}")
    def inner(child: Any, where: str) -> pa.DataType:
        return _avro_type(child, where, defaults_optional)

    if isinstance(node, list):
        raise SchemaError(f"{path or 'the record'}: a union is only supported as a record field's type ([\"null\", T])")
    if not isinstance(node, dict):
        raise SchemaError(f"{path or 'the record'}: expected an Avro type, found {node!r}")
    kind, logical = node.get("type"), node.get("logicalType")
    if logical == "decimal":
        return _decimal(int(node.get("precision", 0)), int(node.get("scale", 0)), f"at {path}")
    if logical == "date":
        return pa.date32()
    if logical in ("timestamp-millis", "timestamp-micros"):
        return UTC_TIMESTAMP
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return LOCAL_TIMESTAMP
    if kind == "record":
        fields = node.get("fields")
        if not isinstance(fields, list):
            raise SchemaError(f"{path or 'the record'}: a record needs a \"fields\" list")
        out = []
        for i, f in enumerate(fields):
            if not isinstance(f, dict) or "name" not in f or "type" not in f:
                raise SchemaError(f"{path or 'the record'}: field #{i} needs \"name\" and \"type\"")
            name = f["name"]
            where = f"{path}.{name}" if path else str(name)
            t, nullable = f["type"], False
            if isinstance(t, list):
                rest = [u for u in t if u != "null"]
                if len(rest) != 1:
                    raise SchemaError(f"{where}: union {t!r} must be [\"null\", T]")
                nullable, t = len(rest) < len(t), rest[0]
            nullable = nullable or (defaults_optional and "default" in f)
            out.append(pa.field(name, inner(t, where), nullable=nullable))
        names = [f.name for f in out]
        if len(set(names)) != len(names):
            raise SchemaError(f"{path or 'the record'}: a field name appears twice")
        return pa.struct(out)
    if kind == "array":
        return pa.list_(pa.field("element", inner(node.get("items"), f"{path}.items")))
    if kind == "map":
        return pa.map_(pa.string(), inner(node.get("values"), f"{path}.values"))
    if kind == "enum":
        return pa.string()
    if kind == "fixed":
        return pa.binary()
    if kind in _AVRO_PRIMITIVES:
        return _AVRO_PRIMITIVES[kind]
    raise SchemaError(f"{path or 'the record'}: unknown or unsupported Avro type {kind!r}")
