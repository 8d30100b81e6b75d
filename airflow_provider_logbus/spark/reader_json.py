"""The JSON parse of values inside the `logbus` data source's Python workers, with
pyarrow's C++ parser, for the rows where pyarrow's answer is Spark's.

The load job decodes values with Spark's `from_json` (`decode.py`), which is the
definition of what a value means. Parsing there costs a second pass in the JVM over
bytes the Python workers have just decoded (BENCHMARKS.md, "Issue 25"). So the reader
parses first, with pyarrow, and hands Spark each row it parsed as the same struct
`from_json` would build; `decode_json` takes that struct where there is one
(`coalesce`) and runs `from_json` on the rest. The rule that keeps the two parsers from
ever disagreeing: pyarrow's answer is used only where it cannot differ from Spark's,
and any doubt sends the row to Spark.

- Only schemas of types whose JSON conversion is the same in both: string, boolean,
  tinyint..bigint, double, and structs and arrays of them (`arrow_value_type`). A
  timestamp, date, decimal, float, binary or map anywhere leaves the whole parse to
  Spark (their string formats, rounding and time zones are Spark's own).
- Only values that are one JSON object: non-empty, first byte `{` and last byte `}`,
  valid UTF-8, parsed by pyarrow without error into exactly one row each. pyarrow
  refuses a number where the schema says string, a string or fraction where it says
  an integer, an integer out of range, a repeated key, a stray byte — Spark then
  decides (and stringifies, rejects or takes the last key as it always did).
- Not where the two parsers' limits differ (`_left_to_spark`, conservative: any doubt
  goes to Spark). Spark's Jackson refuses `Inf`, `-Inf` and `-NaN`, which pyarrow reads
  as numbers, so a value with the bytes `Inf` or `NaN` anywhere goes to Spark (it does
  take `NaN` and `Infinity`, but the rows are rare). Jackson also refuses nesting
  deeper than 1,000, numbers of 1,000 digits or more, names of 50,000 characters and
  strings of 20,000,000: a value of 1,000 bytes or more goes to Spark if it holds 1,000
  brackets or digits, or has 50,000 bytes. Below 1,000 bytes none of these limits can
  be reached. A differential test feeds both parsers mutated JSON and finds none of
  what pyarrow takes read otherwise by Spark.
- A batch of values that pyarrow refuses is halved until the refused values are
  isolated in spans of at most `MIN_SPAN`, so one bad value costs Spark's parse of a
  few rows, not of a whole fetch.

A row the reader parsed needs its raw bytes only if it will be rejected, which then
can only be for a required field left null: its `value` is kept when a top-level
required field is null (or always, when a nested field is required), and is dropped
otherwise, so the bytes do not cross into the JVM twice.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

PARSED_IN_READER = "_logbus_parsed_in_reader"  # the reader's struct, null where Spark must parse
CORRUPT = "_logbus_corrupt_record"  # decode.CORRUPT: always null in the reader's struct
MIN_SPAN = 64  # values: a refused batch is halved down to spans this small
LONG_VALUE = 1000  # bytes: below this, no value can reach one of Jackson's limits
JACKSON_MAX = 1000  # brackets or digits in a long value: Jackson's nesting and number limits
JACKSON_MAX_NAME = 50_000  # bytes of a long value: Jackson's name limit (strings: 20,000,000)

_SCALARS = {"string": "string", "boolean": "bool_", "byte": "int8", "short": "int16", "integer": "int32",
            "long": "int64", "double": "float64"}


def arrow_value_type(spark_struct_json: str) -> "pa.StructType | None":
    """The pyarrow type of a Spark struct (its `.json()`), plus the always-null CORRUPT
    field, all nullable as `from_json` returns it; None when any type in it is one whose
    JSON conversion is Spark's own, or when it has no fields."""
    import pyarrow as pa

    def convert(t):
        if isinstance(t, str):
            return getattr(pa, _SCALARS[t])() if t in _SCALARS else None
        if t.get("type") == "struct":
            fields = [(f["name"], convert(f["type"])) for f in t["fields"]]
            return None if any(c is None for _, c in fields) else pa.struct(fields)
        if t.get("type") == "array":
            element = convert(t["elementType"])
            return None if element is None else pa.list_(element)
        return None

    spec = json.loads(spark_struct_json)
    if not spec.get("fields"):
        return None
    struct = convert(spec)
    return None if struct is None else pa.struct([*struct, pa.field(CORRUPT, pa.string())])


def spark_parsed_type(spark_struct_json: str):
    """The Spark type of the reader's struct column: `from_json`'s result (every field
    nullable) with the CORRUPT field."""
    from pyspark.sql.types import ArrayType, StringType, StructField, StructType

    def nullable(t):
        if isinstance(t, StructType):
            return StructType([StructField(f.name, nullable(f.dataType), True) for f in t.fields])
        if isinstance(t, ArrayType):
            return ArrayType(nullable(t.elementType), True)
        return t

    struct = nullable(StructType.fromJson(json.loads(spark_struct_json)))
    return StructType([*struct.fields, StructField(CORRUPT, StringType(), True)])


def parse_values(values: "pa.BinaryArray", value_type: "pa.StructType", required: list[str],
                 keep_values: bool) -> tuple["pa.StructArray", "pa.BinaryArray"]:
    """(the reader's struct per row, null where Spark must parse; the values Spark still
    needs: those of rows it parses or may reject, null for the others)."""
    import numpy as np
    import pyarrow as pa

    n = len(values)
    pieces: list[tuple[int, int, pa.StructArray | None]] = []
    _parse_span(values, 0, n, value_type, _left_to_spark(values), pieces)
    parsed = pa.concat_arrays([p if p is not None else pa.nulls(hi - lo, value_type) for lo, hi, p in pieces]) \
        if pieces else pa.array([], value_type)
    keep = np.asarray(parsed.is_null())
    if keep_values:
        keep = np.ones(n, dtype=bool)
    for name in required:
        keep |= np.asarray(parsed.field(name).is_null())
    if keep.all():
        return parsed, values
    return parsed, _where(values, keep)


def _parse_span(values, lo: int, hi: int, value_type, spark_only, out: list) -> None:
    if lo >= hi:
        return
    parsed = None if spark_only[lo:hi].any() else _parse_exactly(values.slice(lo, hi - lo), value_type)
    if parsed is not None or hi - lo <= MIN_SPAN:
        out.append((lo, hi, parsed))
        return
    mid = (lo + hi) // 2
    _parse_span(values, lo, mid, value_type, spark_only, out)
    _parse_span(values, mid, hi, value_type, spark_only, out)


def _left_to_spark(values):
    """Per value: True where Spark must parse it — null or empty, not `{`…`}`, or where
    the two parsers' limits may differ (module docstring) — in one numpy pass over the
    values' bytes for the whole fetch, never a Python step per value."""
    import numpy as np

    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=bool)
    offsets = _offsets(values)
    starts, lengths = offsets[:-1], np.diff(offsets)
    spark_only = np.asarray(values.is_null()) | (lengths <= 0)
    if values.buffers()[2] is None or spark_only.all():
        return np.ones(n, dtype=bool)
    data = np.frombuffer(values.buffers()[2], dtype=np.uint8)[:offsets[-1]]
    some = ~spark_only
    spark_only[some] = ((data[starts[some]] != ord("{")) | (data[starts[some] + lengths[some] - 1] != ord("}")))
    for word in (b"Inf", b"NaN"):
        at = np.flatnonzero(data[:len(data) - 2] == word[0])
        at = at[(data[at + 1] == word[1]) & (data[at + 2] == word[2])]
        spark_only[np.searchsorted(offsets, at, side="right") - 1] = True
    long = lengths >= LONG_VALUE
    if long.any():
        marks = ((data == ord("[")) | (data == ord("{")) | ((data >= ord("0")) & (data <= ord("9"))))
        counted = np.concatenate([[0], np.cumsum(marks, dtype=np.int64)])
        per_value = counted[offsets[1:]] - counted[offsets[:-1]]
        spark_only |= long & ((per_value >= JACKSON_MAX) | (lengths >= JACKSON_MAX_NAME))
    return spark_only


def _parse_exactly(values, value_type):
    """The values (each one `{`…`}`: `_left_to_spark`) as one struct per value, or
    None unless pyarrow parses every one of them without complaint into one row."""
    import pyarrow as pa
    import pyarrow.json as pj

    offsets = _offsets(values)
    try:
        values.cast(pa.string())  # UTF-8: pyarrow would pass invalid bytes through where Spark replaces them
        fields = pa.schema(list(value_type)[:-1])
        table = pj.read_json(pa.BufferReader(values.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))),
                             read_options=pj.ReadOptions(use_threads=False, block_size=1 << 30),
                             parse_options=pj.ParseOptions(explicit_schema=fields, unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != len(values):  # a value holding two objects
        return None
    columns = [table.column(name).combine_chunks() for name in fields.names]
    return pa.StructArray.from_arrays([*columns, pa.nulls(len(values), pa.string())], fields=list(value_type))


def _offsets(values):
    """The values' n + 1 offsets into their data buffer (absolute: a slice keeps its parent's)."""
    import numpy as np

    return np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset:values.offset + len(values) + 1]


def _where(values, keep):
    """`values` with nulls where `keep` is false."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.if_else(pa.array(keep), values, pa.nulls(len(values), values.type))
