"""JSON-Schema documents (`{"type": "object", "properties": ...}`) read into Arrow types."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from airflow_provider_logbus.schema.types import SchemaError, UTC_TIMESTAMP


def _json_schema_type(node: Any, path: str, required: bool) -> tuple[pa.DataType, bool]:
    """(arrow type, nullable) of a JSON-Schema node at `path` (dotted field names)."""
    path = path or "the top level"
    if not isinstance(node, dict):
        raise SchemaError(f"{path}: expected a schema object, found {node!r}")
    kinds = node.get("type")
    if kinds is None:
        raise SchemaError(f"{path}: has no \"type\"")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    nullable = "null" in kinds or not required
    kinds = [k for k in kinds if k != "null"]
    if len(kinds) != 1:
        raise SchemaError(f"{path}: type {node.get('type')!r} must name exactly one type besides \"null\"")
    kind = kinds[0]
    if kind == "string":
        fmt = node.get("format")
        if fmt == "date-time":
            return UTC_TIMESTAMP, nullable
        if fmt == "date":
            return pa.date32(), nullable
        if node.get("contentEncoding") == "base64":
            return pa.binary(), nullable
        return pa.string(), nullable
    if kind == "integer":
        return pa.int64(), nullable
    if kind == "number":
        return pa.float64(), nullable
    if kind == "boolean":
        return pa.bool_(), nullable
    if kind == "array":
        if "items" not in node:
            raise SchemaError(f"{path}: an array needs \"items\"")
        element, _ = _json_schema_type(node["items"], f"{path}.items", required=False)
        return pa.list_(pa.field("element", element)), nullable
    if kind == "object":
        properties = node.get("properties")
        extra = node.get("additionalProperties")
        if not properties and isinstance(extra, dict):
            value, _ = _json_schema_type(extra, f"{path}.additionalProperties", required=False)
            return pa.map_(pa.string(), value), nullable
        if not isinstance(properties, dict):
            raise SchemaError(f"{path}: an object needs \"properties\" (or \"additionalProperties\" for a map)")
        needed = set(node.get("required", []))
        unknown = sorted(needed - set(properties))
        if unknown:
            raise SchemaError(f"{path}: \"required\" names {unknown[0]!r}, which is not in \"properties\"")
        fields = []
        for name, child in properties.items():
            where = name if path == "the top level" else f"{path}.{name}"
            t, child_nullable = _json_schema_type(child, where, name in needed)
            fields.append(pa.field(name, t, nullable=child_nullable))
        return pa.struct(fields), nullable
    raise SchemaError(f"{path}: unknown JSON Schema type {kind!r} (string, integer, number, boolean, array, object)")
