"""The REST API (docs/schemas.md, "API"): a request's method, path, query and body to a
status and a JSON answer, with the caller authenticated and authorized first. No HTTP
here (that is `broker.registry.server`), so every answer can be reasoned about alone."""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import parse_qs, unquote

from kazoo.exceptions import KazooException

from broker.common.acls import Operation
from broker.registry import errors
from broker.registry.access import Access
from broker.registry.compatibility import Level
from broker.registry.schemas import TYPES, Schema, parse
from broker.registry.subjects import Subjects

logger = logging.getLogger(__name__)

Answer = tuple[int, Any]
MAX_SUBJECT_LENGTH = 255


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, ["false"])[-1].lower() == "true"


def _body(raw: bytes) -> dict:
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.malformed_request(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise errors.malformed_request("the body must be a JSON object")
    return body


def _schema(raw: bytes) -> Schema:
    body = _body(raw)
    if body.get("references"):
        raise errors.invalid_schema("schema references are not supported by this registry")
    if body.get("metadata") or body.get("ruleSet"):
        raise errors.invalid_schema("schema metadata and rule sets are not supported by this registry")
    return parse(body.get("schema"), body.get("schemaType"))


def _subject(name: str) -> str:
    """A subject named in a path: 1..255 printable characters (42208 otherwise)."""
    if not name or len(name) > MAX_SUBJECT_LENGTH or not name.isprintable():
        raise errors.invalid_subject(name)
    return name


def _id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise errors.schema_not_found(f"Schema {text} not found") from None


class Api:
    def __init__(self, subjects: Subjects, access: Access) -> None:
        self.subjects, self.access = subjects, access

    def handle(self, method: str, path: str, query_text: str, raw: bytes, authorization: str | None) -> Answer:
        """(status, body) for one request; a `RegistryError` becomes its own answer."""
        try:
            principal = self.access.principal(authorization)
            parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
            return 200, self._route(method, parts, parse_qs(query_text), raw, principal, path)
        except errors.RegistryError as exc:
            return exc.status, exc.body()
        except KazooException as exc:  # ZooKeeper unreachable, session lost, a node refused...
            logger.warning("%s %s: ZooKeeper failed: %r", method, path, exc)
            return 500, errors.store_error(f"ZooKeeper: {type(exc).__name__} {exc}".strip()).body()
        except Exception:  # a bug: answered, logged with its traceback, the process serves on
            logger.exception("%s %s failed", method, path)
            return 500, errors.RegistryError(500, 50000, "Internal error (logged by the registry)").body()

    def _route(self, method: str, parts: list[str], query: dict, raw: bytes, who: str, path: str) -> Any:
        head, n = (parts[0] if parts else ""), len(parts)
        if method == "GET" and n == 0:
            return {}
        if head == "subjects":
            return self._subjects(method, parts[1:], query, raw, who, path)
        if head == "schemas":
            return self._schemas(method, parts[1:], query, who, path)
        if head == "config" and n <= 2:
            return self._config(method, _subject(parts[1]) if n == 2 else None, query, raw, who)
        if head == "compatibility" and n in (4, 5) and parts[1] == "subjects" and parts[3] == "versions" \
                and method == "POST":
            subject = _subject(parts[2])
            self.access.require(who, Operation.READ, subject)
            problems = self.subjects.compatibility(subject, _schema(raw), parts[4] if n == 5 else None)
            answer: dict = {"is_compatible": not problems}
            if _flag(query, "verbose"):
                answer["messages"] = problems
            return answer
        raise errors.not_found(path)

    def _subjects(self, method: str, rest: list[str], query: dict, raw: bytes, who: str, path: str) -> Any:
        deleted, n = _flag(query, "deleted"), len(rest)
        if n == 0 and method == "GET":
            return self.access.visible(who, self.subjects.subjects(deleted))
        if n == 0:
            raise errors.not_found(path)
        subject = _subject(rest[0])
        writes = method in ("DELETE",) or (method == "POST" and n == 2)
        self.access.require(who, Operation.WRITE if writes else Operation.READ, subject)
        if n == 1 and method == "POST":
            return self.subjects.lookup(subject, _schema(raw), deleted)
        if n == 1 and method == "DELETE":
            return self.subjects.delete_subject(subject, _flag(query, "permanent"))
        if n == 2 and rest[1] == "versions" and method == "GET":
            return list(self.subjects.live(subject, deleted))
        if n == 2 and rest[1] == "versions" and method == "POST":
            return {"id": self.subjects.register(subject, _schema(raw))}
        if n == 3 and rest[1] == "versions" and method == "GET":
            return self.subjects.version(subject, rest[2], deleted)
        if n == 3 and rest[1] == "versions" and method == "DELETE":
            return self.subjects.delete_version(subject, rest[2], _flag(query, "permanent"))
        if n == 4 and rest[1] == "versions" and rest[3] == "schema" and method == "GET":
            return json.loads(self.subjects.version(subject, rest[2], deleted)["schema"])
        raise errors.not_found(path)

    def _schemas(self, method: str, rest: list[str], query: dict, who: str, path: str) -> Any:
        if method == "GET" and rest == ["types"]:
            return list(TYPES)
        if method != "GET" or len(rest) not in (2, 3) or rest[0] != "ids":
            raise errors.not_found(path)
        schema_id = _id(rest[1])
        schema = self.subjects.schema(schema_id)
        if self.access.secured:
            self.access.require_any(who, self.subjects.store.subjects_using(schema_id),
                                    f"schema {schema_id} (Read on a subject using it)")
        if len(rest) == 2:
            return {"schema": schema.text} | ({"schemaType": schema.type} if schema.type != "AVRO" else {})
        if rest[2] == "versions":
            return self.subjects.uses_of(schema_id)
        if rest[2] == "subjects":
            return sorted({u["subject"] for u in self.subjects.uses_of(schema_id)})
        raise errors.not_found(path)

    def _config(self, method: str, subject: str | None, query: dict, raw: bytes, who: str) -> Any:
        if subject is None:
            if method == "PUT":
                self.access.require_cluster(who, Operation.ALTER)
        else:
            self.access.require(who, Operation.WRITE if method in ("PUT", "DELETE") else Operation.READ, subject)
        store = self.subjects.store
        if method == "GET":
            if subject is not None and store.level(subject) is None and not _flag(query, "defaultToGlobal"):
                raise errors.subject_config_not_found(subject)
            return {"compatibilityLevel": self.subjects.level(subject).value}
        if method == "PUT":
            level = Level.parse(_body(raw).get("compatibility"))
            store.set_level(subject, level.value)
            return {"compatibility": level.value}
        if method == "DELETE" and subject is not None:
            if store.level(subject) is None:
                raise errors.subject_config_not_found(subject)
            previous = self.subjects.level(subject)
            store.delete_level(subject)
            return {"compatibilityLevel": previous.value}
        raise errors.RegistryError(405, 405, f"HTTP 405 Method Not Allowed: {method} /config")
