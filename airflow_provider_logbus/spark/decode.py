"""Decoding JSON values into columns, for the load job: the schema (declared or
inferred), one `from_json` pass that marks what does not decode — empty, not JSON, not
an object, a wrong type, a required field missing (through structs, arrays and maps) —
and, for the rejected rows only, why (`explain_rejects`). Spark expressions only: the
values never pass through Python rows (the data source may have parsed most of them
already, with pyarrow, where its answer is Spark's: `reader_json.py`).
"""

from __future__ import annotations

import datetime
import decimal
import json
import logging
from dataclasses import dataclass
from functools import reduce

from airflow_provider_logbus.spark.reader_json import CORRUPT, PARSED_IN_READER

logger = logging.getLogger("logbus.load_job")

META_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "headers")  # a row's, and its reject's
ERROR = "_logbus_error"
UNEXPLAINED = "\x00unexplained"  # a value from_json could not parse, until `explain_rejects` says why
RAW = "_logbus_raw_value"
PARSED = "_logbus_parsed"
EMPTY = "_logbus_empty"
REJECT = "_logbus_reject"  # the load job's reject record of a row: null when accepted


@dataclass
class JsonSchema:
    """The schema values are decoded with, and where it came from."""

    struct: object  # pyspark StructType
    ddl: str | None  # None: nothing to infer from (no values)
    source: str  # "declared" or "inferred"
    arrow: object = None  # pyarrow.Schema of a declared schema (nested required fields)


def infer_json_schema(spark, df, sample: int = 1000):
    """Spark's inference over the first `sample` non-empty values; malformed ones are
    left out (Spark would add a `_corrupt_record` column for them)."""
    from pyspark.sql.types import StructType

    rows = [r.value.decode("utf-8", "replace") for r in df.select("value").limit(sample).collect() if r.value]
    if not rows:
        return StructType([])
    inferred = spark.read.json(spark.sparkContext.parallelize(rows)).schema
    return _one_field_per_name(StructType([f for f in inferred.fields if f.name != "_corrupt_record"]), rows)


def _one_field_per_name(struct, rows: list[str]):
    """`struct` with one field per name, as Spark resolves names (without case): a key
    repeated in a value, or spelled in two cases across the sample, makes Spark infer a
    field twice, and then no column of that name can be selected. Kept: the spelling
    most values of the sample use."""
    from collections import Counter

    from pyspark.sql.types import StructType

    names = Counter(f.name.lower() for f in struct.fields)
    if max(names.values(), default=0) < 2:
        return struct
    used: Counter = Counter()
    for row in rows:
        try:
            used.update(json.loads(row).keys())
        except (ValueError, AttributeError):
            pass
    kept: dict[str, object] = {}
    for f in struct.fields:
        best = kept.get(f.name.lower())
        if best is None or used[f.name] > used[best.name]:
            kept[f.name.lower()] = f
    dropped = sorted({f.name for f in struct.fields} - {f.name for f in kept.values()})
    logger.warning("the sample spells JSON keys %s in more than one way (or repeats them in a value); inferred one "
                   "field per name, the spelling most values use: %s", dropped or sorted(names),
                   ", ".join(sorted(f.name for f in kept.values() if names[f.name.lower()] > 1)))
    return StructType([f for f in struct.fields if kept[f.name.lower()] is f])


def json_schema(spark, df, schema: str | None, sample: int = 1000) -> JsonSchema:
    """The declared schema (DDL or a .json file, via `airflow_provider_logbus.schema`), or
    one inferred from a sample — logged, never silent."""
    from pyspark.sql.types import StructType

    from airflow_provider_logbus.schema import SchemaError, ValueSchema, load_schema

    if schema:
        declared = load_schema(schema)
        ddl = declared.to_ddl()
        logger.info("decoding JSON values with the declared schema (%s): %s", declared.source, ddl)
        return JsonSchema(StructType.fromDDL(ddl), ddl, "declared", declared.to_arrow())
    struct = infer_json_schema(spark, df, sample)
    try:
        ddl = ValueSchema.from_ddl(struct.toDDL()).to_ddl() if struct.fields else None
    except SchemaError:
        ddl = struct.toDDL()
    logger.warning("no schema declared: inferred from a sample of up to %d values, which the next batch may infer "
                   "differently; declare it (--schema) to keep the table's types fixed. Inferred schema: %s",
                   sample, ddl or "(no fields)")
    return JsonSchema(struct, ddl, "inferred")


# ------------------------------------------------------------------ decoding


def _sql_name(t) -> str:
    return t.simpleString()


def non_null_default(t):
    """A non-null literal of Spark type `t`: `coalesce(col, it)` tells the Parquet writer a
    column is REQUIRED (the rows where `col` is null are rejected before)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(t, T.StructType):
        return F.struct(*[F.lit(None).cast(f.dataType).alias(f.name) for f in t.fields])
    if isinstance(t, T.ArrayType):
        return F.array().cast(t)
    if isinstance(t, T.MapType):
        return F.create_map().cast(t)
    if isinstance(t, T.StringType):
        return F.lit("")
    if isinstance(t, T.BinaryType):
        return F.lit(bytearray())
    if isinstance(t, T.BooleanType):
        return F.lit(False)
    if isinstance(t, T.TimestampType):
        return F.lit(datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc))
    if isinstance(t, T.TimestampNTZType):
        return F.lit(datetime.datetime(1970, 1, 1)).cast(t)
    if isinstance(t, T.DateType):
        return F.lit(datetime.date(1970, 1, 1))
    if isinstance(t, T.DecimalType):
        return F.lit(decimal.Decimal(0)).cast(t)
    return F.lit(0).cast(t)


def _required_paths(arrow_type, path: str) -> list[str]:
    """The required fields below a field of `arrow_type` (for messages)."""
    import pyarrow as pa

    if pa.types.is_struct(arrow_type):
        return [p for f in arrow_type for p in ([f"{path}.{f.name}"] if not f.nullable else [])
                + _required_paths(f.type, f"{path}.{f.name}")]
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return _required_paths(arrow_type.value_type, f"{path}[]")
    if pa.types.is_map(arrow_type):
        return _required_paths(arrow_type.item_type, f"{path}{{}}")
    return []


def required_fields(schema: JsonSchema) -> tuple[list[str], bool]:
    """(the declared schema's required top-level fields, whether a field below them is
    required too): which rows can be rejected for a null where the value parsed."""
    if schema.arrow is None:
        return [], False
    return ([f.name for f in schema.arrow if not f.nullable],
            any(_required_paths(f.type, f.name) for f in schema.arrow))


def _nested_nulls(col, arrow_type, path: str) -> list[tuple[str, object]]:
    """(path, condition) for the required fields below `col` that are null while their
    parent is not, through structs, array elements (`a[]`) and map values (`m{}`)."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    def any_null(x, t, p):
        conditions = [c for _, c in _nested_nulls(x, t, p)]
        return x.isNotNull() & reduce(lambda a, b: a | b, conditions)

    out = []
    if pa.types.is_struct(arrow_type):
        for f in arrow_type:
            child = col.getField(f.name)
            if not f.nullable:
                out.append((f"{path}.{f.name}", child.isNull()))
            out += [(p, child.isNotNull() & c) for p, c in _nested_nulls(child, f.type, f"{path}.{f.name}")]
    elif pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        element = arrow_type.value_type
        if _required_paths(element, f"{path}[]"):
            label = ", ".join(_required_paths(element, f"{path}[]"))
            out.append((label, F.exists(col, lambda x: any_null(x, element, f"{path}[]"))))
    elif pa.types.is_map(arrow_type):
        item = arrow_type.item_type
        if _required_paths(item, f"{path}{{}}"):
            label = ", ".join(_required_paths(item, f"{path}{{}}"))
            out.append((label, F.exists(F.map_values(col), lambda x: any_null(x, item, f"{path}{{}}"))))
    return out


def _variant_path(name: str) -> str | None:
    if "'" in name or "\\" in name:
        return None
    return f"$['{name}']"


def decode_json(df, schema: JsonSchema, extra_columns: tuple[str, ...] = ()):
    """Parse `value` with `schema`: every row gets the value fields (renamed `value_<name>`
    when they clash with a logbus or partition column), `_logbus_error` (null for a good
    value, else what was wrong — `UNEXPLAINED` for a value that did not parse, until
    `explain_rejects` says why) and `_logbus_raw_value` (the bytes of a rejected value).
    Where the data source parsed a row already (`spark/reader_json.py`), `from_json`
    is not run on it.
    Returns (frame, [(field, output column)])."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    struct: StructType = schema.struct
    fields = [f.name for f in struct.fields]
    taken = {*META_COLUMNS, *extra_columns, RAW, ERROR, REJECT}
    clashes = [f for f in fields if f in taken]
    if clashes:
        logger.warning("JSON fields %s clash with logbus columns; they are kept as value_<name>", clashes)
    outputs = [(f, f"value_{f}" if f in clashes else f) for f in fields]

    text = F.col("value").cast("string")
    parsed = F.col(PARSED)
    required: list[tuple[str, object]] = []
    if schema.arrow is not None:
        for f in schema.arrow:
            column = parsed.getField(f.name)
            if not f.nullable:
                required.append((f.name, column.isNull()))
            required += [(p, column.isNotNull() & c) for p, c in _nested_nulls(column, f.type, f.name)]
    missing = F.concat(F.lit("required field missing or null: "),
                       F.concat_ws(", ", *[F.when(c, F.lit(p)) for p, c in required])) if required else None

    empty = F.col("value").isNull() | (F.length("value") == 0)
    parse = _parse(text, struct)
    if PARSED_IN_READER in df.columns:  # the reader parsed these rows already, and dropped values not needed
        empty = F.col(PARSED_IN_READER).isNull() & empty
        parse = F.coalesce(F.col(PARSED_IN_READER), parse)
    error = (F.when(F.col(EMPTY), F.lit("empty value"))
             .when(parsed.isNull(), F.lit("empty value"))  # only whitespace
             .when(parsed.getField(CORRUPT).isNotNull(), F.lit(UNEXPLAINED)))
    if required:
        error = error.when(reduce(lambda a, b: a | b, [c for _, c in required]), missing)

    frame = df.select(*META_COLUMNS, "value", parse.alias(PARSED), empty.alias(EMPTY))
    frame = frame.select(*META_COLUMNS, F.col("value").alias(RAW),
                         *[parsed.getField(f).alias(out) for f, out in outputs], error.alias(ERROR))
    # the error is computed once; only a rejected value keeps its bytes
    frame = frame.select(*META_COLUMNS, F.when(F.col(ERROR).isNotNull(), F.col(RAW)).alias(RAW),
                         *[out for _, out in outputs], ERROR)
    return frame, outputs


def _parse(text, struct):
    """`from_json` that keeps what does not parse in the CORRUPT field."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    with_corrupt = StructType([*struct.fields, StructField(CORRUPT, StringType())])
    return F.from_json(text, with_corrupt, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})


def explain_rejects(frame, schema: JsonSchema):
    """Replace `UNEXPLAINED` in the error column of rejected rows by why the value did
    not parse: not JSON, not an object, or which field had the wrong type. The diagnosis
    parses the value a second time (as a variant); it sits in its own projection, in a
    CASE WHEN on `UNEXPLAINED`, which Spark evaluates for the rejected rows only (inside
    the main projection Spark evaluated that parse on every row: BENCHMARKS.md, "Issue
    25: the Spark load")."""
    from pyspark.sql import functions as F

    text = F.col(RAW).cast("string")
    reason = _corrupt_reason(text, _parse(text, schema.struct), schema.struct)
    return frame.withColumn(ERROR, F.when(F.col(ERROR) == UNEXPLAINED, reason).otherwise(F.col(ERROR)))


def _corrupt_reason(text, parsed, struct):
    """Why a value from_json kept as corrupt (`parsed`) failed, as text."""
    from pyspark.sql import functions as F

    variant = F.try_parse_json(text)
    first = F.regexp_extract(text, r"^\s*(.)", 1)
    kind = (F.when(first == "[", "an array").when(first == '"', "a string").when(first == "n", "null")
            .when(first.isin("t", "f"), "a boolean").otherwise("a number"))
    mismatches = []
    for field in struct.fields:
        path = _variant_path(field.name)
        if path is None:
            continue
        sub = F.try_variant_get(variant, path, "variant")
        mismatches.append(F.when(sub.isNotNull() & ~F.is_variant_null(sub) & parsed.getField(field.name).isNull(),
                                 F.concat(F.lit(f"{field.name}: expected {_sql_name(field.dataType)}, got "),
                                          F.lower(F.schema_of_variant(sub)))))
    detail = F.concat_ws("; ", *mismatches) if mismatches else F.lit("")
    mismatch = F.concat(F.lit("does not fit the schema: "),
                        F.when(detail != "", detail).otherwise(
                            F.concat(F.lit("value is "), F.lower(F.schema_of_variant(variant)))))
    return (F.when(variant.isNull(), F.lit("not valid JSON"))
            .when(first != "{", F.concat(F.lit("not a JSON object: "), kind))
            .otherwise(mismatch))
