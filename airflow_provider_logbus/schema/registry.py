"""A schema registry subject's latest version as a declared value schema (docs/schemas.md,
"Loads"): what a load with `schema_subject` declares, and what the compatibility check
compares with the table. Asked at the load task, after the snapshot fixed the batch's
ranges: a writer registers (or looks up) its version before it produces with it, so
the latest version then is at least as new as every value in the ranges.

Avro records become Arrow fields by `schema/avro.py` (record -> struct, a union with
null -> optional, logical types -> timestamp, date, decimal), with one rule of its own:
a field with a default is optional, because a version may add it (the registry accepts
that as compatible) while the rows already in the table have no value for it. JSON
Schema subjects read as a `.json` schema file does. Plain Python: no Airflow.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass

from airflow_provider_logbus.registry_access import RegistryAccess, UnknownSchema
from airflow_provider_logbus.schema.types import SchemaError
from airflow_provider_logbus.schema.value import ValueSchema


@dataclass(frozen=True)
class SubjectVersion:
    """One registered version of a subject, and the value schema it declares."""

    subject: str
    version: int
    schema_id: int
    schema_type: str  # AVRO or JSON
    value_schema: ValueSchema

    def describe(self) -> str:
        return f"subject {self.subject!r} version {self.version} (schema id {self.schema_id})"


def latest_version(registry: RegistryAccess, subject: str) -> SubjectVersion:
    """The subject's latest live version (`GET /subjects/{s}/versions/latest`) from the
    first of the registry's URLs that answers. An unknown subject, a Protobuf one or a
    schema without a table form raises `SchemaError` with the reason; no registry
    answering (or refusing the credentials), `RegistryUnavailable`."""
    if not registry.urls:
        raise SchemaError("schema_subject needs the registry: registry_url or registry_conn_id")
    try:
        body = registry.get(f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest")
    except UnknownSchema as exc:
        raise SchemaError(f"schema registry {registry.url} has no latest version of subject {subject!r}: "
                          f"{exc}") from None
    return _subject_version(body, subject, registry.url)


def _subject_version(body: dict, subject: str, url: str) -> SubjectVersion:
    schema_type = body.get("schemaType", "AVRO")
    where = f"subject {subject!r} version {body.get('version')} (schema id {body.get('id')}) at {url}"
    if schema_type not in ("AVRO", "JSON"):
        raise SchemaError(f"{where} is {schema_type}: only Avro and JSON Schema subjects declare a table's columns")
    try:
        document = json.loads(body["schema"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SchemaError(f"{where}: the registry's answer holds no schema document ({exc})") from None
    if schema_type == "AVRO" and not (isinstance(document, dict) and document.get("type") == "record"):
        raise SchemaError(f"{where}: an Avro {document!r:.80} is not a record; a table's columns are a record's "
                          "fields")
    value_schema = ValueSchema.from_document(document, source=where, avro_defaults_optional=True)
    return SubjectVersion(subject, int(body["version"]), int(body["id"]), schema_type, value_schema)
