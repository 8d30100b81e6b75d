"""Schemas as the registry takes them: parsed (a schema that does not parse is refused,
42201, before anything is stored), and reduced to one canonical text — the JSON
document with its object keys sorted and no whitespace — that is what is stored, what
is served, and what decides identity: the same canonical text (of the same type) is
one schema and has one id, whichever subject registers it and however it was spaced.
Avro's Parsing Canonical Form is not used for identity because it drops defaults and
docs, which are what a compatible evolution changes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import avro.errors
import avro.schema
import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from broker.registry.errors import invalid_schema

AVRO, JSON = "AVRO", "JSON"
TYPES = (AVRO, JSON)


@dataclass(frozen=True)
class Schema:
    """A parsed schema: its type, its canonical text and the parsed document."""

    type: str
    text: str  # canonical
    document: Any = None

    @property
    def fingerprint(self) -> str:
        """What ZooKeeper keys the schema's id by (`broker.registry.store`)."""
        return hashlib.sha256(f"{self.type}\0{self.text}".encode()).hexdigest()

    def avro(self) -> avro.schema.Schema:
        return avro.schema.parse(self.text)


def parse(text: object, schema_type: object = AVRO) -> Schema:
    """The schema of a request body's `schema` and `schemaType`, or 42201 with the reason."""
    schema_type = AVRO if schema_type is None else schema_type
    if schema_type not in TYPES:
        raise invalid_schema(f"unsupported schemaType {schema_type!r}: this registry takes {', '.join(TYPES)}")
    if not isinstance(text, str) or not text.strip():
        raise invalid_schema("the request's 'schema' must be the schema's text, a non-empty string")
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise invalid_schema(f"the schema is not JSON: {exc}") from None
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if schema_type == AVRO:
        try:
            avro.schema.parse(canonical)
        except (avro.errors.AvroException, ValueError, TypeError, KeyError) as exc:
            raise invalid_schema(f"not a valid Avro schema: {exc}") from None
    else:
        if not isinstance(document, (dict, bool)):
            raise invalid_schema("a JSON Schema is an object or a boolean")
        try:
            jsonschema.validators.validator_for(document).check_schema(document)
        except jsonschema.exceptions.SchemaError as exc:
            raise invalid_schema(f"not a valid JSON Schema: {exc.message}") from None
    return Schema(schema_type, canonical, document)


def stored(text: str, schema_type: str) -> Schema:
    """A schema read back from the store (parsed when it was registered)."""
    return Schema(schema_type, text, json.loads(text))
