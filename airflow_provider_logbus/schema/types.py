"""What every schema format shares: the error, the Arrow types of timestamps and
decimals, and the primitive type names."""

from __future__ import annotations

import pyarrow as pa


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


def _decimal(precision: int, scale: int, where: str) -> pa.DataType:
    if not 1 <= precision <= _MAX_DECIMAL_PRECISION or not 0 <= scale <= precision:
        raise SchemaError(f"decimal({precision},{scale}) {where}: precision must be 1..{_MAX_DECIMAL_PRECISION} "
                          f"and scale 0..precision")
    return pa.decimal128(precision, scale)
