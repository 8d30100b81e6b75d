"""The Avro body of a registry-framed value, read with its writer's schema — and, when
the table is declared as an Avro record, resolved to that record as the reader schema
(Avro schema resolution, fastavro's `schemaless_reader(writer, reader)`): a field the
writer lacks takes the table's default, an int written is read as the table's long (and
float as double, the specification's promotions), and a field the writer lacks that has
no default in the table is a reject. Records are matched by full name (or an alias of
the table's), as the specification says. With a table declared in DDL or JSON Schema
there is no reader schema: the writer's record is taken as written, its fields by name.
"""

from __future__ import annotations

import functools
import io
import json
import re

from airflow_provider_logbus.spark.decode_fit import RejectedValue
from airflow_provider_logbus.spark.registry_schemas import WriterSchema

_NO_DEFAULT = re.compile(r"No default value for field (\S+) in (\S+)")
MAX_DETAIL = 300


def reader_schema(spec: str | None) -> str | None:
    """The table's Avro record as JSON text when the declared schema `spec` is a .json
    file holding one (`{"type": "record", ...}`); None for a DDL or a JSON Schema."""
    text = str(spec or "").strip()
    if not text.lower().endswith(".json"):
        return None
    with open(text, encoding="utf-8") as file:
        document = json.load(file)  # read as the declared schema already (its errors said there)
    return json.dumps(document) if isinstance(document, dict) and document.get("type") == "record" else None


@functools.lru_cache(maxsize=16)
def parsed_reader(text: str):
    """fastavro's parse of a reader schema (raises on one that is not valid Avro)."""
    import fastavro

    return fastavro.parse_schema(json.loads(text))


def read_avro(body: bytes, writer: WriterSchema, reader: str | None = None) -> dict:
    """The record in `body`, written with `writer` (and resolved to `reader`, Avro JSON
    text); raises `RejectedValue` saying why it cannot be read."""
    import fastavro
    from fastavro.read import SchemaResolutionError

    resolved = parsed_reader(reader) if reader else None
    if resolved is not None:
        _check_names(writer, resolved)
    stream = io.BytesIO(body)
    try:
        record = fastavro.schemaless_reader(stream, writer.parsed, resolved)
    except SchemaResolutionError as exc:
        raise RejectedValue(f"schema id {writer.schema_id} does not resolve to the table's Avro schema: "
                            f"{_resolution(str(exc), resolved)}") from None
    except Exception as exc:  # fastavro raises what the bytes make it raise (EOFError, UnicodeDecodeError, ...)
        raise RejectedValue(f"does not decode with schema id {writer.schema_id}: {type(exc).__name__}: {exc}") from None
    if stream.tell() != len(body):
        raise RejectedValue(f"does not decode with schema id {writer.schema_id}: {len(body) - stream.tell()} bytes "
                            f"left after the record")
    if not isinstance(record, dict):
        raise RejectedValue(f"schema id {writer.schema_id} is not a record")
    return record


def _check_names(writer: WriterSchema, reader) -> None:
    """Refuse a writer record of another full name than the table's (or its aliases)."""
    written = writer.parsed.get("name") if isinstance(writer.parsed, dict) else None
    names = {reader.get("name"), *reader.get("aliases", ())}
    if written is not None and written not in names:
        raise RejectedValue(f"schema id {writer.schema_id} does not resolve to the table's Avro schema: the writer's "
                            f"record {written} is not the table's {reader.get('name')} (records are matched by full "
                            f"name or an alias of the table's)")


def _resolution(text: str, reader) -> str:
    missing = _NO_DEFAULT.search(text)
    if missing:
        field, record = missing.groups()
        where = "" if record == reader.get("name") else f" of record {record}"
        return f"the writer has no field {field}{where}, and the table gives it no default"
    return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL] + "..."
