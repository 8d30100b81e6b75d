"""A decoded record (a dict from Avro or JSON) fitted to the table's declared columns
(`pyarrow.Schema`, nullable unless required), through structs, arrays and maps: a
required field missing or null, or a value of another type, is a reject with the path
of each field, as the JSON path words it ("required field missing or null: geo.lat",
"does not fit the schema: a: expected int, got str"). JSON text has no timestamps,
dates, bytes or decimals: from a JSON value they are read from their JSON spelling
(ISO 8601, base64, a number), as Spark's `from_json` reads them.

The values returned are what a Python UDF of the columns' Spark types may return; an
integer out of its column's range is refused here (Spark would wrap it around).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal

import pyarrow as pa

from airflow_provider_logbus.schema import ddl_type

_INT_BITS = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64}


class RejectedValue(ValueError):
    """Why a framed value cannot be loaded (the reject's reason)."""


class _Mismatch(Exception):
    """A value is not of its column's type."""


def fit_record(record: dict, schema: pa.Schema, from_json: bool = False) -> dict:
    """`record`'s fields by name into `schema`'s columns (a field the record lacks is
    null); raises `RejectedValue` naming every required field missing (else every
    mismatch)."""
    fitting = _Fitting(from_json)
    out = {f.name: fitting.field(record.get(f.name), f, f.name) for f in schema}
    if fitting.missing:
        raise RejectedValue(f"required field missing or null: {', '.join(dict.fromkeys(fitting.missing))}")
    if fitting.wrong:
        raise RejectedValue(f"does not fit the schema: {'; '.join(dict.fromkeys(fitting.wrong))}")
    return out


class _Fitting:
    """One record's walk, collecting what is missing and what does not fit."""

    def __init__(self, from_json: bool) -> None:
        self.from_json = from_json
        self.missing: list[str] = []
        self.wrong: list[str] = []

    def field(self, value, f: pa.Field, path: str):
        if value is None:
            if not f.nullable:
                self.missing.append(path)
            return None
        try:
            return self.value(value, f.type, path)
        except _Mismatch:
            in_range = not isinstance(value, int) or isinstance(value, bool) or f.type not in _INT_BITS
            shown = type(value).__name__ if in_range else f"{value} (out of range)"
            self.wrong.append(f"{path}: expected {ddl_type(f.type)}, got {shown}")
            return None

    def value(self, v, t: pa.DataType, path: str):
        if pa.types.is_struct(t):
            _expect(v, dict)
            return {f.name: self.field(v.get(f.name), f, f"{path}.{f.name}") for f in t}
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            _expect(v, list)
            return [self.field(x, t.value_field, f"{path}[]") for x in v]
        if pa.types.is_map(t):
            _expect(v, dict)
            return {k: self.field(x, t.item_field, f"{path}{{}}") for k, x in v.items()}
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return _expect(v, str)
        if pa.types.is_boolean(t):
            return _expect(v, bool)
        if t in _INT_BITS:
            bits = _INT_BITS[t]
            if not -(1 << (bits - 1)) <= _expect(v, int) < 1 << (bits - 1):
                raise _Mismatch
            return v
        if pa.types.is_floating(t):
            return float(_expect(v, (int, float)))
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return _base64(v) if self.from_json else _expect(v, bytes)
        if pa.types.is_decimal(t):
            return _decimal(v, t, self.from_json)
        if pa.types.is_timestamp(t):
            return _timestamp(v, t.tz is not None, self.from_json)
        if pa.types.is_date(t):
            if self.from_json:
                return _parse(datetime.date.fromisoformat, _expect(v, str))
            if isinstance(v, datetime.datetime):
                raise _Mismatch
            return _expect(v, datetime.date)
        raise _Mismatch


def _expect(v, kinds):
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in (kinds if isinstance(kinds, tuple)
                                                                          else (kinds,))):
        raise _Mismatch  # a bool is an int to Python, not to Spark
    return v


def _parse(parser, text: str):
    try:
        return parser(text)
    except ValueError:
        raise _Mismatch from None


def _base64(v) -> bytes:
    try:
        return base64.b64decode(_expect(v, str), validate=True)
    except binascii.Error:
        raise _Mismatch from None


def _decimal(v, t: pa.Decimal128Type, from_json: bool) -> decimal.Decimal:
    if from_json and isinstance(v, (int, float, str)) and not isinstance(v, bool):
        v = _parse(decimal.Decimal, str(v)) if not isinstance(v, str) else _parse(_decimal_text, v)
    try:
        exact = _expect(v, decimal.Decimal).quantize(decimal.Decimal(1).scaleb(-t.scale), decimal.ROUND_HALF_UP)
    except decimal.InvalidOperation:  # more digits than the context holds
        raise _Mismatch from None
    if not exact.is_finite() or len(exact.as_tuple().digits) > t.precision:
        raise _Mismatch
    return exact


def _decimal_text(text: str) -> decimal.Decimal:
    try:
        return decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise ValueError(text) from None


def _timestamp(v, utc: bool, from_json: bool) -> datetime.datetime:
    if from_json:
        v = _parse(datetime.datetime.fromisoformat, _expect(v, str))
    _expect(v, datetime.datetime)
    if utc:
        return v if v.tzinfo is not None else v.replace(tzinfo=datetime.timezone.utc)  # as the session's UTC
    return v if v.tzinfo is None else v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
