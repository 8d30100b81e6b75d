"""Spark DDL, both ways: `ddl_type` writes an Arrow type as Spark DDL (for `from_json`
and `StructType.fromDDL`); `_DdlParser` reads a DDL string into Arrow fields."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from airflow_provider_logbus.schema.types import SchemaError, _DECIMALS, _PRIMITIVES, _decimal


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
