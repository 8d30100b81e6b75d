"""Declared value schemas: what the fields of a topic's JSON values are, fixed once
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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["SchemaError", "ValueSchema", "load_schema", "check_evolution", "ddl_type"]


class SchemaError(ValueError):
    """A schema that cannot be parsed, or a change a table cannot take; the message
    names the position or the field and both types."""


UTC_TIMESTAMP = pa.timestamp("us", tz="UTC")
LOCAL_TIMESTAMP = pa.timestamp("us")

_PRIMITIVES: dict[str, pa.DataType] = {
    "string": pa.string(), "varchar": pa.string(), "char": pa.string(),
    "int": pa.int32(), "integer": pa.int32(),
    "long": pa.int64(), "bigint": pa.int64(),
    "short": pa.int16(), "smallint": pa.int16(),
    "byte": pa.int8(), "tinyint": pa.int8(),
    "double": pa.float64(), "float": pa.float32(), "real": pa.float32(),
    "boolean": pa.bool_(), "bool": pa.bool_(),
    "binary": pa.binary(), "date": pa.date32(),
    "timestamp": UTC_TIMESTAMP, "timestamp_ltz": UTC_TIMESTAMP, "timestamp_ntz": LOCAL_TIMESTAMP,
}
_DECIMALS = ("decimal", "dec", "numeric")
_MAX_DECIMAL_PRECISION = 38


# ------------------------------------------------------------------ the schema


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
    def from_document(cls, document: dict, source: str = "<json schema>") -> "ValueSchema":
        """A JSON-Schema or Avro-record document already loaded."""
        return cls(_schema_from_document(document, source), source=source)

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


# ------------------------------------------------------------------ DDL out


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def ddl_type(t: pa.DataType) -> str:
    """The Spark DDL name of an arrow type (lower case)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    simple = {pa.int8(): "tinyint", pa.int16(): "smallint", pa.int32(): "int", pa.int64(): "bigint",
              pa.float32(): "float", pa.float64(): "double", pa.bool_(): "boolean", pa.date32(): "date"}
    if t in simple:
        return simple[t]
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_map(t):
        return f"map<{ddl_type(t.key_type)}, {ddl_type(t.item_type)}>"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"array<{ddl_type(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(_ddl_field(t.field(i), top=False) for i in range(t.num_fields)) + ">"
    raise SchemaError(f"arrow type {t} has no Spark DDL equivalent")


def _ddl_field(f: pa.Field, top: bool) -> str:
    sep = " " if top else ": "
    return f"{_quote(f.name)}{sep}{ddl_type(f.type)}{'' if f.nullable else ' NOT NULL'}"


# ------------------------------------------------------------------ DDL in

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>\d+)
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<punct>[<>(),:])
""", re.VERBOSE)


@dataclass(frozen=True)
class _Token:
    kind: str  # quoted, word, number, string, punct, end
    text: str
    pos: int

    def show(self) -> str:
        return "the end" if self.kind == "end" else repr(self.text)


class _DdlParser:
    """Recursive descent over `name type [NOT NULL] [COMMENT '...']` lists."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = self._tokenize(text)
        self.i = 0

    def _tokenize(self, text: str) -> list[_Token]:
        tokens, pos = [], 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                raise SchemaError(f"schema DDL: unexpected character {text[pos]!r} at position {pos}: "
                                  f"{self._context(pos)}")
            if m.lastgroup != "space":
                value = m.group()
                if m.lastgroup == "quoted":
                    value = value[1:-1].replace("``", "`")
                tokens.append(_Token(m.lastgroup, value, pos))
            pos = m.end()
        tokens.append(_Token("end", "", len(text)))
        return tokens

    def _context(self, pos: int) -> str:
        return f"{self.text[:pos]}<HERE>{self.text[pos:]}"

    def _error(self, expected: str, token: _Token | None = None) -> SchemaError:
        token = token or self.peek
        return SchemaError(f"schema DDL: expected {expected} at position {token.pos}, found {token.show()}: "
                           f"{self._context(token.pos)}")

    @property
    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def accept(self, text: str) -> bool:
        if self.peek.kind in ("punct", "word") and self.peek.text.lower() == text:
            self.i += 1
            return True
        return False

    def expect(self, text: str, expected: str | None = None) -> None:
        if not self.accept(text):
            raise self._error(expected or repr(text))

    def schema(self) -> pa.Schema:
        if self.peek.kind == "end":
            raise SchemaError("schema DDL is empty: give at least one field, e.g. 'n long'")
        fields = self.fields(top=True)
        if self.peek.kind != "end":
            raise self._error("',' or the end of the schema")
        return pa.schema(fields)

    def fields(self, top: bool) -> list[pa.Field]:
        fields = [self.field(top)]
        while self.accept(","):
            fields.append(self.field(top))
        names = [f.name for f in fields]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise SchemaError(f"schema DDL: field {duplicates[0]!r} is declared twice")
        return fields

    def field(self, top: bool) -> pa.Field:
        token = self.take()
        if token.kind not in ("word", "quoted"):
            raise self._error("a field name", token)
        self.accept(":")
        t = self.type()
        nullable = True
        if self.accept("not"):
            self.expect("null", "NULL after NOT")
            nullable = False
        if self.accept("comment"):
            if self.take().kind != "string":
                raise self._error("a quoted comment", self.tokens[self.i - 1])
        return pa.field(token.text, t, nullable=nullable)

    def type(self) -> pa.DataType:
        token = self.take()
        if token.kind != "word":
            raise self._error("a type", token)
        name = token.text.lower()
        if name in _DECIMALS:
            return self.decimal(token)
        if name in ("varchar", "char") and self.accept("("):
            self.number()
            self.expect(")")
        if name in _PRIMITIVES:
            return _PRIMITIVES[name]
        if name == "array":
            self.expect("<")
            element = self.type()
            self.expect(">")
            return pa.list_(pa.field("element", element))
        if name == "map":
            self.expect("<")
            key_token = self.peek
            key = self.type()
            if not pa.types.is_string(key):
                raise SchemaError(f"schema DDL: map keys must be string (JSON object keys), found "
                                  f"{ddl_type(key)} at position {key_token.pos}: {self._context(key_token.pos)}")
            self.expect(",")
            value = self.type()
            self.expect(">")
            return pa.map_(pa.string(), value)
        if name == "struct":
            self.expect("<")
            if self.accept(">"):
                return pa.struct([])
            fields = self.fields(top=False)
            self.expect(">", "',' or '>'")
            return pa.struct(fields)
        known = ", ".join(sorted(set(_PRIMITIVES) | {"decimal(p,s)", "array<T>", "map<string,T>", "struct<...>"}))
        raise SchemaError(f"schema DDL: unknown type {token.text!r} at position {token.pos} (known: {known}): "
                          f"{self._context(token.pos)}")

    def number(self) -> int:
        token = self.take()
        if token.kind != "number":
            raise self._error("a number", token)
        return int(token.text)

    def decimal(self, token: _Token) -> pa.DataType:
        precision, scale = 10, 0
        if self.accept("("):
            precision = self.number()
            if self.accept(","):
                scale = self.number()
            self.expect(")")
        return _decimal(precision, scale, f"at position {token.pos}")


def _decimal(precision: int, scale: int, where: str) -> pa.DataType:
    if not 1 <= precision <= _MAX_DECIMAL_PRECISION or not 0 <= scale <= precision:
        raise SchemaError(f"decimal({precision},{scale}) {where}: precision must be 1..{_MAX_DECIMAL_PRECISION} "
                          f"and scale 0..precision")
    return pa.decimal128(precision, scale)


# ------------------------------------------------------------------ JSON files in


def _schema_from_document(document: Any, source: str) -> pa.Schema:
    if not isinstance(document, dict):
        raise SchemaError(f"{source}: a schema document is a JSON object, found {type(document).__name__}")
    try:
        if document.get("type") == "record" or "fields" in document:
            struct = _avro_type(document, "")
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


_AVRO_PRIMITIVES = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
                    "double": pa.float64(), "bytes": pa.binary(), "string": pa.string()}


def _avro_type(node: Any, path: str) -> pa.DataType:
    """The arrow type of an Avro type at `path` (dotted field names; "" at the top)."""
    if isinstance(node, str):
        if node in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[node]
        raise SchemaError(f"{path or 'the record'}: unknown or unsupported Avro type {node!r}")
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
            out.append(pa.field(name, _avro_type(t, where), nullable=nullable))
        names = [f.name for f in out]
        if len(set(names)) != len(names):
            raise SchemaError(f"{path or 'the record'}: a field name appears twice")
        return pa.struct(out)
    if kind == "array":
        return pa.list_(pa.field("element", _avro_type(node.get("items"), f"{path}.items")))
    if kind == "map":
        return pa.map_(pa.string(), _avro_type(node.get("values"), f"{path}.values"))
    if kind == "enum":
        return pa.string()
    if kind == "fixed":
        return pa.binary()
    if kind in _AVRO_PRIMITIVES:
        return _AVRO_PRIMITIVES[kind]
    raise SchemaError(f"{path or 'the record'}: unknown or unsupported Avro type {kind!r}")


# ------------------------------------------------------------------ evolution

_WIDENINGS = {(pa.int32(), pa.int64()), (pa.float32(), pa.float64())}


def _normal(t: pa.DataType) -> pa.DataType:
    """Types that store the same values compare equal (string/large_string, timestamp units)."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz is not None else None)
    return t


def _widens(old: pa.DataType, new: pa.DataType) -> bool:
    if (old, new) in _WIDENINGS:
        return True
    return (pa.types.is_decimal(old) and pa.types.is_decimal(new) and old.scale == new.scale
            and new.precision > old.precision)


def _kind(t: pa.DataType) -> str:
    if pa.types.is_struct(t):
        return "struct"
    if pa.types.is_map(t):
        return "map"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "list"
    return "primitive"


def _show(t: pa.DataType) -> str:
    try:
        return ddl_type(t)
    except SchemaError:
        return str(t)


def _compare_types(name: str, old: pa.DataType, new: pa.DataType, added: list[str]) -> None:
    kind = _kind(old)
    if kind != _kind(new):
        raise SchemaError(f"field {name!r} changes type from {_show(old)} to {_show(new)}: not a widening "
                          "(allowed: int -> bigint, float -> double, decimal precision up with the same scale)")
    if kind == "struct":
        _compare_fields(name, [old.field(i) for i in range(old.num_fields)],
                        [new.field(i) for i in range(new.num_fields)], added)
    elif kind == "list":
        _compare_types(f"{name}.element", old.value_type, new.value_type, added)
    elif kind == "map":
        _compare_types(f"{name}.key", old.key_type, new.key_type, added)
        _compare_types(f"{name}.value", old.item_type, new.item_type, added)
    else:
        o, n = _normal(old), _normal(new)
        if o == n or _widens(o, n):
            return
        what = "a narrowing" if _widens(n, o) else "not a widening"
        raise SchemaError(f"field {name!r} changes type from {_show(old)} to {_show(new)}: {what} "
                          "(allowed: int -> bigint, float -> double, decimal precision up with the same scale)")


def _compare_fields(prefix: str, current: list[pa.Field], declared: list[pa.Field], added: list[str]) -> None:
    existing = {f.name: f for f in current}
    for f in declared:
        name = f"{prefix}.{f.name}" if prefix else f.name
        old = existing.get(f.name)
        if old is None:
            if not f.nullable:
                raise SchemaError(f"field {name!r} ({_show(f.type)} NOT NULL) is added as required: rows already "
                                  "in the table have no value for it; add it as optional")
            added.append(name)
            continue
        if old.nullable and not f.nullable:
            raise SchemaError(f"field {name!r} ({_show(old.type)} -> {_show(f.type)} NOT NULL) is made required: "
                              "rows already in the table may hold nulls; keep it optional")
        _compare_types(name, old.type, f.type, added)


def check_evolution(current: pa.Schema, declared: pa.Schema) -> list[str]:
    """May a table whose schema is `current` take rows of the `declared` schema?

    Returns the top-level fields to add by union by name: new optional fields, and
    existing struct/list/map fields that gain optional fields inside (`geo` when
    `geo.lon` is new), so `declared.field(name)` is what to union. Raises `SchemaError`
    naming the field (a dotted path when nested) and both types for a type change that
    is not a widening, a narrowing, a required field added or an optional field made
    required. Fields of `current` absent from `declared` are fine: they stay and read as
    null for new rows."""
    existing = {f.name: f for f in current}
    added: list[str] = []
    for f in declared:
        if f.name not in existing:
            _compare_fields("", [], [f], added)  # refuses a new required field
            continue
        inside: list[str] = []
        _compare_fields("", [existing[f.name]], [f], inside)
        if inside:
            added.append(f.name)
    return added
