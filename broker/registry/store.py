"""The registry's state in ZooKeeper (docs/schemas.md, "Storage"), the same for every
registry process:

    /logbus_schemas/ids/<id>                {"schema": canonical text, "schemaType": "AVRO"|"JSON"}
    /logbus_schemas/fingerprints/<sha256>   the id of the schema with that fingerprint (decimal)
    /logbus_schemas/id_sequence/id-<n>      sequential, deleted at once: its counter hands out ids
    /logbus_schemas/subjects/<subject>/<v>  {"id": <id>, "deleted": false}
    /logbus_schemas/uses/<id>/<subject>     empty: the subject has (or had) a version with the id
    /logbus_schemas/config                  {"compatibilityLevel": ...}, the global level (absent: BACKWARD)
    /logbus_schemas/config/<subject>        {"compatibilityLevel": ...}, a subject's own level

Ids: a new schema takes the next number of ZooKeeper's sequential-node counter, which
never goes back (a node's children counter survives their deletion), and is written in
one transaction with its fingerprint node. Of two processes registering one schema at
once, one transaction creates the fingerprint and the other fails as a whole and
reads the winner's id: one schema, one id; an id is written once and never rewritten:
one id, one schema. A lost race leaves a gap in the numbers, never a reuse. Versions:
a subject's next version is a conditional create; the loser re-reads and checks its
schema again against the version that won."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from urllib.parse import quote, unquote

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from broker.common.zklayout import SCHEMAS
from broker.registry.errors import store_error
from broker.registry.schemas import Schema, stored

IDS = f"{SCHEMAS}/ids"
FINGERPRINTS = f"{SCHEMAS}/fingerprints"
ID_SEQUENCE = f"{SCHEMAS}/id_sequence"
SUBJECTS = f"{SCHEMAS}/subjects"
USES = f"{SCHEMAS}/uses"
CONFIG = f"{SCHEMAS}/config"
CACHED = 10_000  # schemas (and fingerprints) kept in the process


def _name(subject: str) -> str:
    """A subject as one znode name: percent-encoded, and never "." or ".."."""
    name = quote(subject, safe="")
    return name.replace(".", "%2E") if name in (".", "..") else name


@dataclass(frozen=True)
class Version:
    id: int
    deleted: bool = False

    def encode(self) -> bytes:
        return json.dumps({"id": self.id, "deleted": self.deleted}).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Version":
        node = json.loads(data)
        return cls(int(node["id"]), bool(node.get("deleted", False)))


class SchemaStore:
    """Reads and conditional writes of the layout above; no rule of the API (those are
    `broker.registry.subjects`)."""

    def __init__(self, zk: KazooClient, acl=None) -> None:
        self.zk, self.acl = zk, acl
        self._schemas: dict[int, Schema] = {}  # id -> schema, immutable in ZooKeeper
        self._ids: dict[str, int] = {}  # fingerprint -> id, likewise
        self._cache_lock = threading.Lock()
        for path in (IDS, FINGERPRINTS, ID_SEQUENCE, SUBJECTS, USES, CONFIG):
            zk.ensure_path(path, acl=acl)

    # ------------------------------------------------------------------ schemas, ids

    def schema(self, schema_id: int) -> Schema | None:
        """The id's schema. Cached in the process: an id is written once, never rewritten
        or removed, so a cached answer is never stale (what a deserializer asks costs no
        ZooKeeper read the second time)."""
        schema = self._schemas.get(schema_id)
        if schema is None:
            try:
                data, _ = self.zk.get(f"{IDS}/{int(schema_id)}")
            except NoNodeError:
                return None
            node = json.loads(data)
            schema = self._remember(self._schemas, schema_id, stored(node["schema"], node["schemaType"]))
        return schema

    def id_of(self, schema: Schema) -> int | None:
        """The schema's id, if it has one (cached likewise: fingerprints are never rewritten)."""
        known = self._ids.get(schema.fingerprint)
        if known is None:
            try:
                known = self._remember(self._ids, schema.fingerprint,
                                       int(self.zk.get(f"{FINGERPRINTS}/{schema.fingerprint}")[0]))
            except NoNodeError:
                return None
        return known

    def _remember(self, cache: dict, key, value):
        with self._cache_lock:  # request threads share the caches
            if len(cache) >= CACHED:
                cache.pop(next(iter(cache)))  # the oldest entry
            cache[key] = value
        return value

    def assign_id(self, schema: Schema) -> int:
        """The schema's id, made if it has none (see the module's docstring)."""
        while True:
            known = self.id_of(schema)
            if known is not None:
                return known
            sequence = self.zk.create(f"{ID_SEQUENCE}/id-", b"", sequence=True, acl=self.acl)
            self.zk.delete(sequence)
            schema_id = int(sequence.rsplit("-", 1)[1]) + 1  # ids start at 1, as Confluent's
            transaction = self.zk.transaction()
            transaction.create(f"{IDS}/{schema_id}", json.dumps({"schema": schema.text, "schemaType": schema.type})
                               .encode(), acl=self.acl)
            transaction.create(f"{FINGERPRINTS}/{schema.fingerprint}", str(schema_id).encode(), acl=self.acl)
            results = transaction.commit()
            if not any(isinstance(r, Exception) for r in results):
                return schema_id
            if not isinstance(results[1], NodeExistsError):
                raise store_error(f"writing schema id {schema_id} failed: {results!r}")

    # ------------------------------------------------------------------ subjects

    def subjects(self) -> list[str]:
        return sorted(unquote(name) for name in self.zk.get_children(SUBJECTS))

    def numbers(self, subject: str) -> list[int]:
        """The subject's version numbers, soft-deleted ones included, ascending."""
        try:
            return sorted(int(child) for child in self.zk.get_children(f"{SUBJECTS}/{_name(subject)}"))
        except NoNodeError:
            return []

    def version(self, subject: str, number: int) -> Version | None:
        try:
            return Version.decode(self.zk.get(f"{SUBJECTS}/{_name(subject)}/{number}")[0])
        except NoNodeError:
            return None

    def used_by(self, schema_id: int, subject: str) -> bool:
        """Whether the subject has, or had, a version with the id."""
        return self.zk.exists(f"{USES}/{schema_id}/{_name(subject)}") is not None

    def versions(self, subject: str) -> dict[int, Version]:
        """Every version of the subject, soft-deleted ones included; {} if none."""
        path = f"{SUBJECTS}/{_name(subject)}"
        try:
            children = self.zk.get_children(path)
        except NoNodeError:
            return {}
        versions = {}
        for child in children:
            try:
                versions[int(child)] = Version.decode(self.zk.get(f"{path}/{child}")[0])
            except NoNodeError:
                continue
        return dict(sorted(versions.items()))

    def add_version(self, subject: str, version: int, schema_id: int) -> bool:
        """Create the subject's `version`, and the id's use by the subject, in one
        transaction; False if another registration took the version (or the subject
        was removed meanwhile): the caller reads again."""
        folder, use = f"{SUBJECTS}/{_name(subject)}", f"{USES}/{schema_id}/{_name(subject)}"
        self.zk.ensure_path(folder, acl=self.acl)
        transaction = self.zk.transaction()
        transaction.create(f"{folder}/{version}", Version(schema_id).encode(), acl=self.acl)
        if self.zk.exists(use) is None:
            self.zk.ensure_path(f"{USES}/{schema_id}", acl=self.acl)
            transaction.create(use, b"", acl=self.acl)
        results = transaction.commit()
        failed = [r for r in results if isinstance(r, (NodeExistsError, NoNodeError))]
        if failed:
            return False
        if any(isinstance(r, Exception) for r in results):
            raise store_error(f"writing version {version} of subject '{subject}' failed: {results!r}")
        return True

    def subjects_using(self, schema_id: int) -> list[str]:
        """The subjects that have, or had, a version with the id."""
        try:
            return sorted(unquote(name) for name in self.zk.get_children(f"{USES}/{int(schema_id)}"))
        except NoNodeError:
            return []

    def soft_delete(self, subject: str, version: int) -> None:
        path = f"{SUBJECTS}/{_name(subject)}/{version}"
        while True:
            data, stat = self.zk.get(path)
            try:
                self.zk.set(path, Version(Version.decode(data).id, True).encode(), version=stat.version)
                return
            except BadVersionError:
                continue

    def hard_delete(self, subject: str, version: int) -> None:
        """Remove a version, and the subject's node with its last one."""
        folder = f"{SUBJECTS}/{_name(subject)}"
        try:
            self.zk.delete(f"{folder}/{version}")
        except NoNodeError:
            pass
        try:
            self.zk.delete(folder)
        except (NotEmptyError, NoNodeError):
            pass

    # ------------------------------------------------------------------ config

    def level(self, subject: str | None) -> str | None:
        """The subject's own compatibility level (the global one for None); None if unset."""
        try:
            data, _ = self.zk.get(CONFIG if subject is None else f"{CONFIG}/{_name(subject)}")
        except NoNodeError:
            return None
        return json.loads(data)["compatibilityLevel"] if data else None

    def set_level(self, subject: str | None, level: str) -> None:
        path = CONFIG if subject is None else f"{CONFIG}/{_name(subject)}"
        data = json.dumps({"compatibilityLevel": level}).encode()
        try:
            self.zk.set(path, data)
        except NoNodeError:
            try:
                self.zk.create(path, data, acl=self.acl)
            except NodeExistsError:
                self.zk.set(path, data)

    def delete_level(self, subject: str) -> None:
        try:
            self.zk.delete(f"{CONFIG}/{_name(subject)}")
        except NoNodeError:
            pass
