"""A decoded record (a dict from Avro or JSON) fitted to the table's declared columns
(`pyarrow.Schema`, nullable unless required), through structs, arrays and maps: a
required field missing or null, or a value of another type, is a reject with the path
of each field, as the JSON path words it ("required field missing or null: geo.lat",
"does not fit the schema: a: expected int, got str"). JSON text has no timestamps,
dates, bytes or decimals: from a JSON value they are read from their JSON spelling
(ISO 8601, base64, a number), as Spark's `from_json` reads them.

The values returned are what a Python UDF of the columns' Spark types may return; an
integer out of its column's range is refused here (Spark would wrap it around). Every
value of a load passes through here: `TableFit` turns the schema into plain functions
once (asking pyarrow about types per value cost three times the decoding).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import uuid
from typing import Callable

import pyarrow as pa

from airflow_provider_logbus.schema import ddl_type

_INT_BITS = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64}
_MISSING, _WRONG = "missing", "wrong"
Convert = Callable[[object, list], object]  # (value, problems) -> the column's value; raises _Mismatch


class RejectedValue(ValueError):
    """Why a framed value cannot be loaded (the reject's reason)."""


class _Mismatch(Exception):
    """A value is not of its column's type."""


class _Field:
    """One field of the walk: where it is, what it takes, how to convert it."""

    __slots__ = ("name", "nullable", "convert", "path", "expected", "is_int")

    def __init__(self, f: pa.Field, path: str, from_json: bool) -> None:
        self.name, self.nullable, self.path = f.name, f.nullable, path
        self.convert = _converter(f.type, path, from_json)
        self.expected, self.is_int = ddl_type(f.type), f.type in _INT_BITS

    def fit(self, value, problems: list):
        if value is None:
            if not self.nullable:
                problems.append((_MISSING, self.path))
            return None
        try:
            return self.convert(value, problems)
        except _Mismatch:
            shown = f"{value} (out of range)" if self.is_int and type(value) is int else type(value).__name__
            problems.append((_WRONG, f"{self.path}: expected {self.expected}, got {shown}"))
            return None


class TableFit:
    """The table's columns as converters, for Avro and for JSON records."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.avro = [_Field(f, f.name, False) for f in schema]
        self.json = [_Field(f, f.name, True) for f in schema]

    def __reduce__(self):
        return TableFit, (self.schema,)  # to the executors as the schema; the converters are built there

    def fit(self, record: dict, from_json: bool = False) -> dict:
        """`record`'s fields by name into the columns (a field it lacks is null); raises
        `RejectedValue` naming every required field missing (else every mismatch)."""
        problems: list = []
        out = {f.name: f.fit(record.get(f.name), problems) for f in (self.json if from_json else self.avro)}
        if problems:
            missing = [p for kind, p in problems if kind == _MISSING]
            if missing:
                raise RejectedValue(f"required field missing or null: {', '.join(dict.fromkeys(missing))}")
            wrong = [p for _, p in problems]
            raise RejectedValue(f"does not fit the schema: {'; '.join(dict.fromkeys(wrong))}")
        return out


def fit_record(record: dict, schema: pa.Schema | TableFit, from_json: bool = False) -> dict:
    """`TableFit(schema).fit(record, from_json)`; pass a `TableFit` to convert many."""
    return (schema if isinstance(schema, TableFit) else TableFit(schema)).fit(record, from_json)


def _converter(t: pa.DataType, path: str, from_json: bool) -> Convert:
    if pa.types.is_struct(t):
        fields = [_Field(f, f"{path}.{f.name}", from_json) for f in t]

        def struct(v, problems):
            if type(v) is not dict:
                raise _Mismatch
            return {f.name: f.fit(v.get(f.name), problems) for f in fields}
        return struct
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        is_map = pa.types.is_map(t)
        element = _Field(t.item_field if is_map else t.value_field, f"{path}{{}}" if is_map else f"{path}[]",
                         from_json)

        def many(v, problems):
            if type(v) is not (dict if is_map else list):
                raise _Mismatch
            if is_map:
                return {k: element.fit(x, problems) for k, x in v.items()}
            return [element.fit(x, problems) for x in v]
        return many
    return _primitive(t, from_json)


def _primitive(t: pa.DataType, from_json: bool) -> Convert:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _string
    if pa.types.is_boolean(t):
        return _exactly(bool)
    if t in _INT_BITS:
        bits = _INT_BITS[t]
        low, high = -(1 << (bits - 1)), 1 << (bits - 1)

        def integer(v, _):
            if type(v) is not int:
                v = _time_of_day(v, bits)
            if not low <= v < high:
                raise _Mismatch
            return v
        return integer
    if pa.types.is_floating(t):
        def floating(v, _):
            if type(v) is not float and type(v) is not int:
                raise _Mismatch
            return float(v)
        return floating
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return (lambda v, _: _base64(v)) if from_json else _exactly(bytes)
    if pa.types.is_decimal(t):
        return lambda v, _: _decimal(v, t, from_json)
    if pa.types.is_timestamp(t):
        return lambda v, _: _timestamp(v, t.tz is not None, from_json)
    if pa.types.is_date(t):
        return lambda v, _: _date(v, from_json)
    return _never


def _string(v, _):
    """A string; or a UUID, as fastavro reads Avro's `uuid` logical type (its column is
    the underlying string, as in Spark's Avro reader)."""
    if type(v) is str:
        return v
    if type(v) is uuid.UUID:
        return str(v)
    raise _Mismatch


def _time_of_day(v, bits: int) -> int:
    """Avro's `time-millis` (an int) and `time-micros` (a long), which fastavro reads as
    a `datetime.time`, back to their numbers: the column is the underlying integer, as in
    Spark's Avro reader (Spark has no time type). Anything else is a mismatch."""
    if type(v) is not datetime.time:
        raise _Mismatch
    micros = ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond
    return micros // 1000 if bits == 32 else micros


def _never(v, _):
    raise _Mismatch


def _exactly(kind: type) -> Convert:
    def check(v, _):
        if not isinstance(v, kind) or (type(v) is bool and kind is not bool):
            raise _Mismatch
        return v
    return check


def _parse(parser, v):
    if type(v) is not str:
        raise _Mismatch
    try:
        return parser(v)
    except (ValueError, decimal.InvalidOperation):
        raise _Mismatch from None


def _base64(v) -> bytes:
    return _parse(lambda text: base64.b64decode(text, validate=True), v)  # binascii.Error is a ValueError


def _decimal(v, t: pa.Decimal128Type, from_json: bool) -> decimal.Decimal:
    if from_json and type(v) in (int, float):
        v = str(v)
    if from_json and type(v) is str:
        v = _parse(decimal.Decimal, v)
    if not isinstance(v, decimal.Decimal):
        raise _Mismatch
    try:
        exact = v.quantize(decimal.Decimal(1).scaleb(-t.scale), decimal.ROUND_HALF_UP)
    except decimal.InvalidOperation:  # more digits than the context holds
        raise _Mismatch from None
    if not exact.is_finite() or len(exact.as_tuple().digits) > t.precision:
        raise _Mismatch
    return exact


def _timestamp(v, utc: bool, from_json: bool) -> datetime.datetime:
    if from_json:
        v = _parse(datetime.datetime.fromisoformat, v)
    if not isinstance(v, datetime.datetime):
        raise _Mismatch
    if utc:
        return v if v.tzinfo is not None else v.replace(tzinfo=datetime.timezone.utc)  # as the session's UTC
    return v if v.tzinfo is None else v.astimezone(datetime.timezone.utc).replace(tzinfo=None)


def _date(v, from_json: bool) -> datetime.date:
    if from_json:
        return _parse(datetime.date.fromisoformat, v)
    if not isinstance(v, datetime.date) or isinstance(v, datetime.datetime):
        raise _Mismatch
    return v
