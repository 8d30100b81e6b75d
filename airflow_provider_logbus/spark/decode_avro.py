"""Decoding registry-framed Avro values (`--format confluent`) into the columns the JSON
path produces: a value is magic byte 0, a 4-byte big-endian schema id, then Avro binary
written with that schema. The writer schema is fetched by id from the schema registry
(`GET /schemas/ids/<id>`, docs/schemas.md) once per executor process; the record's
fields are then taken by name into the table's declared fields, so a record written with
an older schema (a field the table has since gained) loads with that field null, and a
required field it lacks is a reject. A value that cannot be decoded — not framed, an id
the registry does not know, bytes the writer schema cannot read, a field of the wrong
type — becomes a reject with the reason, as a JSON value that does not parse does.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
import struct
import urllib.error
import urllib.request

MAGIC = 0
_WRITER_SCHEMAS: dict[tuple[str, int], object] = {}  # (registry url, id) -> parsed schema or the error text

# the Python values fastavro gives that fit a Spark type (by its simpleString prefix)
_FITS = {"string": (str,), "bigint": (int,), "int": (int,), "smallint": (int,), "tinyint": (int,),
         "double": (float, int), "float": (float, int), "boolean": (bool,), "binary": (bytes,),
         "timestamp": (datetime.datetime,), "date": (datetime.date,), "decimal": (decimal.Decimal,),
         "array": (list,), "map": (dict,), "struct": (dict,)}


class RejectedValue(ValueError):
    """Why a framed value cannot be loaded (the reject's reason)."""


def writer_schema(registry_url: str, schema_id: int):
    """The parsed Avro schema of `schema_id`, fetched once per process and registry; an
    unknown id raises `RejectedValue` (also remembered: ids are never reused)."""
    import fastavro

    key = (registry_url, schema_id)
    if key not in _WRITER_SCHEMAS:
        try:
            with urllib.request.urlopen(f"{registry_url.rstrip('/')}/schemas/ids/{schema_id}", timeout=30) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise  # the registry failing is the load failing, not the data being bad
            _WRITER_SCHEMAS[key] = f"schema id {schema_id} is not in the registry at {registry_url}"
        else:
            if body.get("schemaType", "AVRO") != "AVRO":
                _WRITER_SCHEMAS[key] = f"schema id {schema_id} is {body['schemaType']}, not Avro"
            else:
                _WRITER_SCHEMAS[key] = fastavro.parse_schema(json.loads(body["schema"]))
    found = _WRITER_SCHEMAS[key]
    if isinstance(found, str):
        raise RejectedValue(found)
    return found


def decode_value(value: bytes | None, registry_url: str, fields: list[tuple[str, str, bool]]) -> dict:
    """`value` decoded into `fields` ((name, Spark type's simpleString, nullable)); raises
    `RejectedValue` saying why it cannot be."""
    import fastavro

    if not value:
        raise RejectedValue("empty value")
    if len(value) < 5 or value[0] != MAGIC:
        raise RejectedValue(f"not registry-framed: the first byte is {value[0]}, not {MAGIC}" if len(value) >= 5
                            else f"not registry-framed: {len(value)} bytes, shorter than the 5-byte header")
    (schema_id,) = struct.unpack(">I", value[1:5])
    schema = writer_schema(registry_url, schema_id)
    body = io.BytesIO(value[5:])
    try:
        record = fastavro.schemaless_reader(body, schema, None)
    except Exception as exc:  # fastavro raises what the bytes make it raise (EOFError, UnicodeDecodeError, ...)
        raise RejectedValue(f"does not decode with schema id {schema_id}: {type(exc).__name__}: {exc}") from None
    if body.tell() != len(value) - 5:
        raise RejectedValue(f"does not decode with schema id {schema_id}: {len(value) - 5 - body.tell()} bytes "
                            f"left after the record")
    if not isinstance(record, dict):
        raise RejectedValue(f"schema id {schema_id} is not a record")
    missing = [name for name, _, nullable in fields if not nullable and record.get(name) is None]
    if missing:
        raise RejectedValue(f"required field missing or null: {', '.join(missing)}")
    wrong = [f"{name}: expected {kind}, got {type(record[name]).__name__}" for name, kind, _ in fields
             if record.get(name) is not None and not _fits(record[name], kind)]
    if wrong:
        raise RejectedValue(f"does not fit the schema: {'; '.join(wrong)}")
    return {name: record.get(name) for name, _, _ in fields}


def _fits(value, kind: str) -> bool:
    expected = _FITS.get(kind.split("<")[0].split("(")[0], ())
    if isinstance(value, bool) and bool not in expected:
        return False  # a bool is an int to Python, not to Spark
    return isinstance(value, expected)


def decode_confluent(df, schema, registry_url: str, extra_columns: tuple[str, ...] = ()):
    """As `decode.decode_json`, for framed Avro values: (frame, [(field, output column)])
    with the error column already explained (no `explain_rejects` pass)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from airflow_provider_logbus.spark.decode import ERROR, META_COLUMNS, RAW, REJECT

    names = [f.name for f in schema.struct.fields]
    required = set() if schema.arrow is None else {f.name for f in schema.arrow if not f.nullable}
    fields = [(f.name, f.dataType.simpleString(), f.name not in required) for f in schema.struct.fields]
    taken = {*META_COLUMNS, *extra_columns, RAW, ERROR, REJECT}
    outputs = [(f, f"value_{f}" if f in taken else f) for f in names]
    result = StructType([*[StructField(f.name, f.dataType) for f in schema.struct.fields],
                         StructField(ERROR, StringType())])

    def decode(value):
        try:
            return {**decode_value(bytes(value) if value is not None else None, registry_url, fields), ERROR: None}
        except RejectedValue as exc:
            return {**{name: None for name in names}, ERROR: str(exc)}

    decoded = F.udf(decode, result)(F.col("value")).alias("_logbus_decoded")
    frame = df.select(*META_COLUMNS, "value", decoded)
    error = F.col("_logbus_decoded").getField(ERROR)
    frame = frame.select(*META_COLUMNS, F.when(error.isNotNull(), F.col("value")).alias(RAW),
                         *[F.col("_logbus_decoded").getField(f).alias(out) for f, out in outputs], error.alias(ERROR))
    return frame, outputs
