"""Decoding registry-framed values (`--format confluent`) into the columns the JSON path
produces. A value is magic byte 0, a 4-byte big-endian schema id, then the body
written with that schema — Avro binary (confluent_kafka's `AvroSerializer`) or JSON
text (its `JSONSerializer`): the id's type in the registry says which, so one topic may
hold both, id by id. Avro is read by `decode_avro.py` (resolved to the table's Avro
record when it is declared in Avro); JSON is parsed and validated against the writer's
JSON Schema, as `JSONDeserializer` does. Either record is then fitted to the table's
columns (`decode_fit.py`). A value that cannot be loaded — not framed, an id the
registry does not know, bytes that do not decode, a JSON document its schema does not
validate, a field of the wrong type, a required field missing — becomes a reject with
the reason; the registry failing (`RegistryUnavailable`) fails the load.
"""

from __future__ import annotations

import json
import struct

from airflow_provider_logbus.spark.decode_avro import read_avro
from airflow_provider_logbus.spark.decode_fit import RejectedValue, TableFit, fit_record
from airflow_provider_logbus.registry_access import RegistryAccess
from airflow_provider_logbus.spark.registry_schemas import WriterSchema, writer_schema

MAGIC = 0
HEADER = 5


def decode_value(value: bytes | None, registry: RegistryAccess, table: TableFit, reader: str | None = None) -> dict:
    """`value` decoded into the columns of `table` (or a `pyarrow.Schema`), Avro resolved to
    `reader` (the table's Avro record, JSON text) when given; raises `RejectedValue`
    saying why it cannot be."""
    if not value:
        raise RejectedValue("empty value")
    if len(value) < HEADER or value[0] != MAGIC:
        raise RejectedValue(f"not registry-framed: the first byte is {value[0]}, not {MAGIC}" if len(value) >= HEADER
                            else f"not registry-framed: {len(value)} bytes, shorter than the 5-byte header")
    (schema_id,) = struct.unpack(">I", value[1:HEADER])
    writer = writer_schema(registry, schema_id)
    if writer.kind == "JSON":
        return fit_record(read_json(value[HEADER:], writer), table, from_json=True)
    return fit_record(read_avro(value[HEADER:], writer, reader), table)


def read_json(body: bytes, writer: WriterSchema) -> dict:
    """The JSON object in `body`, valid under the writer's JSON Schema (the reason of
    the most relevant violation, jsonschema's `best_match`, otherwise)."""
    from jsonschema.exceptions import best_match

    try:
        document = json.loads(body)
    except ValueError as exc:  # UnicodeDecodeError included
        raise RejectedValue(f"does not decode with schema id {writer.schema_id}: not valid JSON: {exc}") from None
    error = best_match(writer.parsed.iter_errors(document))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path)
        raise RejectedValue(f"does not validate against schema id {writer.schema_id}: "
                            f"{where + ': ' if where else ''}{error.message}")
    if not isinstance(document, dict):
        raise RejectedValue(f"not a JSON object (schema id {writer.schema_id}): {type(document).__name__}")
    return document


def decode_confluent(df, schema, registry: RegistryAccess, extra_columns: tuple[str, ...] = (),
                     reader: str | None = None):
    """As `decode.decode_json`, for framed values: (frame, [(field, output column)])
    with the error column already explained (no `explain_rejects` pass). `schema` is the
    declared `decode.JsonSchema`; every value passes through one Python UDF."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from airflow_provider_logbus.spark.decode import ERROR, META_COLUMNS, RAW, REJECT

    table = TableFit(schema.arrow)
    names = [f.name for f in schema.struct.fields]
    taken = {*META_COLUMNS, *extra_columns, RAW, ERROR, REJECT}
    outputs = [(f, f"value_{f}" if f in taken else f) for f in names]
    result = StructType([*[StructField(f.name, f.dataType) for f in schema.struct.fields],
                         StructField(ERROR, StringType())])

    def decode(value):
        try:
            return {**decode_value(bytes(value) if value is not None else None, registry, table, reader), ERROR: None}
        except RejectedValue as exc:
            return {**{name: None for name in names}, ERROR: str(exc)}

    decoded = F.udf(decode, result)(F.col("value")).alias("_logbus_decoded")
    frame = df.select(*META_COLUMNS, "value", decoded)
    error = F.col("_logbus_decoded").getField(ERROR)
    frame = frame.select(*META_COLUMNS, F.when(error.isNotNull(), F.col("value")).alias(RAW),
                         *[F.col("_logbus_decoded").getField(f).alias(out) for f, out in outputs], error.alias(ERROR))
    return frame, outputs
