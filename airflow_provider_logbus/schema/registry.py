"""A schema registry subject's latest version as a declared value schema (docs/schemas.md,
"Loads"): what a load with `schema_subject` declares, and what the compatibility check
compares with the table. Asked at the load task, after the snapshot fixed the batch's
ranges: a writer registers (or looks up) its version before it produces with it, so
the latest version then is at least as new as every value in the ranges.

Avro records become Arrow fields by `schema/avro.py` (record -> struct, a union with
null -> optional, logical types -> timestamp, date, decimal), with one rule of its own:
a field with a default is optional, because a version may add it (the registry accepts
that as compatible) while the rows already in the table have no value for it. JSON
Schema subjects read as a `.json` schema file does. Plain Python (urllib): no Airflow.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from airflow_provider_logbus.schema.types import SchemaError
from airflow_provider_logbus.schema.value import ValueSchema


class RegistryUnavailable(ConnectionError):
    """No registry of the URL list answered (not the schema's fault: a retry may pass)."""


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


def latest_version(registry_url: str, subject: str, timeout: float = 30) -> SubjectVersion:
    """The subject's latest live version (`GET /subjects/{s}/versions/latest`), from the
    first registry of `registry_url` (comma-separated, as confluent_kafka takes it) that
    answers. An unknown subject, a Protobuf one or a schema without a table form raises
    `SchemaError` with the reason; no registry answering, `RegistryUnavailable`."""
    urls = [u.strip().rstrip("/") for u in registry_url.split(",") if u.strip()]
    if not urls:
        raise SchemaError("schema_subject needs the registry's URL (registry_url)")
    path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest"
    failures = []
    for url in urls:
        try:
            with urllib.request.urlopen(url + path, timeout=timeout) as response:
                return _subject_version(json.loads(response.read()), subject, url)
        except urllib.error.HTTPError as exc:
            if exc.code >= 500:
                failures.append(f"{url}: HTTP {exc.code} {_error_text(exc)}")
                continue
            raise SchemaError(f"schema registry {url} has no latest version of subject {subject!r}: HTTP {exc.code} "
                              f"{_error_text(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            failures.append(f"{url}: {getattr(exc, 'reason', exc)}")
    raise RegistryUnavailable(f"no schema registry answered for subject {subject!r}: {'; '.join(failures)}")


def _error_text(exc: urllib.error.HTTPError) -> str:
    """The registry's `{"error_code", "message"}`, or the body as it came."""
    body = exc.read().decode("utf-8", "replace")
    try:
        error = json.loads(body)
        return f"(error {error['error_code']}: {error['message']})"
    except (ValueError, KeyError, TypeError):
        return body[:200]


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
