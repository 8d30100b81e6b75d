"""Whether a table written with one schema may be written with another: added
nullable fields, widenings (an integer to a wider one, float to double) and required fields made
optional only — and which top-level fields the table must take for it."""

from __future__ import annotations

import pyarrow as pa

from airflow_provider_logbus.schema.ddl import ddl_type
from airflow_provider_logbus.schema.types import SchemaError


_INTEGERS = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
_WIDENINGS = {(a, b) for i, a in enumerate(_INTEGERS) for b in _INTEGERS[i + 1:]} | {(pa.float32(), pa.float64())}


_ALLOWED = "(allowed: an integer to a wider one, float -> double, decimal precision up with the same scale)"


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
        raise SchemaError(f"field {name!r} changes type from {_show(old)} to {_show(new)}: not a widening {_ALLOWED}")
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
        if o == n:
            return
        if _widens(o, n):
            added.append(name)  # the column's type must widen with it
            return
        what = "a narrowing" if _widens(n, o) else "not a widening"
        raise SchemaError(f"field {name!r} changes type from {_show(old)} to {_show(new)}: {what} {_ALLOWED}")


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
        if f.nullable and not old.nullable:
            added.append(name)  # the column must become optional: new rows may be null there
        _compare_types(name, old.type, f.type, added)


def check_evolution(current: pa.Schema, declared: pa.Schema) -> list[str]:
    """May a table whose schema is `current` take rows of the `declared` schema?

    Returns the top-level fields to union by name into the table: new optional fields,
    and existing fields that change in an allowed way — that widen (`n` int -> bigint,
    also inside: `items` when its elements widen), become optional, or gain optional
    fields inside (`geo` when `geo.lon` is new) — so `declared.field(name)` is what to
    union. Without the union, files written with the declared types would not fit the
    table's columns (a bigint file column in an int column, an optional one in a
    required column). Raises `SchemaError`
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
