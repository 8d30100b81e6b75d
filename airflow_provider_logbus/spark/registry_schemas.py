"""The writer schemas of a schema registry, by id, for the load's decoding of framed
values (docs/schemas.md, "Loads"): `GET /schemas/ids/<id>` through `RegistryAccess`
(HTTPS, Basic credentials, several URLs), fetched once per executor process and kept —
ids are never reused, so a kept answer cannot go stale. An id the registry does not
know is the data's fault (the value is a reject); the registry failing otherwise fails
the load (`RegistryUnavailable`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from airflow_provider_logbus.registry_access import RegistryAccess, UnknownSchema

# (registry, id) -> WriterSchema, or the reason the id is not usable (a reject's)
_WRITER_SCHEMAS: dict[tuple[str, int], object] = {}


@dataclass(frozen=True)
class WriterSchema:
    """An id's schema: `kind` "AVRO" (`parsed`: fastavro's) or "JSON" (`parsed`: a
    jsonschema validator)."""

    schema_id: int
    kind: str
    parsed: object


def writer_schema(access: RegistryAccess, schema_id: int) -> WriterSchema:
    """The schema of `schema_id`, fetched once per process and registry; an unknown id
    or an unsupported type raises `RejectedValue` (remembered too: ids are never reused)."""
    from airflow_provider_logbus.spark.decode_fit import RejectedValue

    key = (access.url, schema_id)
    if key not in _WRITER_SCHEMAS:
        try:
            body = access.get(f"/schemas/ids/{schema_id}")
        except UnknownSchema:
            _WRITER_SCHEMAS[key] = f"schema id {schema_id} is not in the registry at {access.url}"
        else:
            _WRITER_SCHEMAS[key] = _parse(schema_id, body.get("schemaType", "AVRO"), json.loads(body["schema"]))
    found = _WRITER_SCHEMAS[key]
    if isinstance(found, str):
        raise RejectedValue(found)
    return found


def _parse(schema_id: int, kind: str, document) -> WriterSchema | str:
    if kind == "AVRO":
        import fastavro

        return WriterSchema(schema_id, kind, fastavro.parse_schema(document))
    if kind == "JSON":
        from jsonschema.validators import Draft7Validator, validator_for

        return WriterSchema(schema_id, kind, validator_for(document, default=Draft7Validator)(document))
    return f"schema id {schema_id} is {kind}, not Avro or JSON"
