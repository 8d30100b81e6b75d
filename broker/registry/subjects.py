"""The registry's rules over the store (docs/schemas.md, "API"): registering under the
subject's compatibility level, looking schemas up, versions, soft and hard deletes as
Confluent orders them, and the levels themselves. Answers are the JSON bodies the API
serves; errors are `RegistryError`s."""

from __future__ import annotations

from broker.registry import errors
from broker.registry.compatibility import DEFAULT, Level, check
from broker.registry.schemas import AVRO, Schema
from broker.registry.store import SchemaStore, Version

REGISTER_ATTEMPTS = 50  # conflicting registrations of one subject before giving up (50001)
MAX_VERSION = 2**31 - 1


def version_number(text: str) -> int | None:
    """A version in a path: a number 1..2^31-1, or None for "latest" (and -1); else 42202."""
    if text in ("latest", "-1"):
        return None
    try:
        number = int(text)
    except ValueError:
        raise errors.invalid_version(text) from None
    if not 1 <= number <= MAX_VERSION:
        raise errors.invalid_version(text)
    return number


def described(subject: str, version: int, schema_id: int, schema: Schema) -> dict:
    body = {"subject": subject, "version": version, "id": schema_id, "schema": schema.text}
    if schema.type != AVRO:
        body["schemaType"] = schema.type
    return body


class Subjects:
    def __init__(self, store: SchemaStore) -> None:
        self.store = store

    # ------------------------------------------------------------------ reads

    def live(self, subject: str, deleted: bool = False) -> dict[int, Version]:
        """The subject's versions (with soft-deleted ones if `deleted`); 40401 if none."""
        versions = {v: n for v, n in self.store.versions(subject).items() if deleted or not n.deleted}
        if not versions:
            raise errors.subject_not_found(subject)
        return versions

    def subjects(self, deleted: bool = False) -> list[str]:
        return [s for s in self.store.subjects()
                if any(deleted or not n.deleted for n in self.store.versions(s).values())]

    def version(self, subject: str, text: str, deleted: bool = False) -> dict:
        versions = self.live(subject, deleted)
        number = version_number(text)
        number = max(versions) if number is None else number
        if number not in versions:
            raise errors.version_not_found(subject, text)
        return described(subject, number, versions[number].id, self.schema(versions[number].id))

    def schema(self, schema_id: int) -> Schema:
        schema = self.store.schema(schema_id)
        if schema is None:
            raise errors.schema_not_found(f"Schema {schema_id} not found")
        return schema

    def uses_of(self, schema_id: int) -> list[dict]:
        """Every (subject, version) that has the id, soft-deleted ones included."""
        return [{"subject": s, "version": v} for s in self.store.subjects_using(schema_id)
                for v, node in self.store.versions(s).items() if node.id == schema_id]

    def lookup(self, subject: str, schema: Schema, deleted: bool = False) -> dict:
        versions = self.live(subject, deleted)
        schema_id = self.store.id_of(schema)
        for number, node in versions.items():
            if node.id == schema_id:
                return described(subject, number, schema_id, schema)
        raise errors.schema_not_found()

    # ------------------------------------------------------------------ writes

    def register(self, subject: str, schema: Schema) -> int:
        """The schema's id under `subject`: the existing one if a live version has it,
        else a new version if the subject's level allows it (409 with the reasons)."""
        schema_id = self.store.assign_id(schema)
        for _ in range(REGISTER_ATTEMPTS):
            versions = self.store.versions(subject)
            live = {v: n for v, n in versions.items() if not n.deleted}
            if any(n.id == schema_id for n in live.values()):
                return schema_id
            problems = check(self.level(subject), schema, [(v, self.schema(n.id)) for v, n in live.items()])
            if problems:
                raise errors.incompatible(problems)
            if self.store.add_version(subject, max(versions, default=0) + 1, schema_id):
                return schema_id
        raise errors.store_error(f"{REGISTER_ATTEMPTS} concurrent registrations under subject '{subject}' won")

    def compatibility(self, subject: str, schema: Schema, version: str | None) -> list[str]:
        """Why `schema` would be refused: against one version (`version`, "latest") by the
        level's direction, or against the live versions as registering would check."""
        level = self.level(subject)
        versions = self.store.versions(subject)
        live = {v: n for v, n in versions.items() if not n.deleted}
        if version is not None:
            number = version_number(version)
            if not live:
                raise errors.subject_not_found(subject)
            number = max(live) if number is None else number
            if number not in live:
                raise errors.version_not_found(subject, version)
            live = {number: live[number]}
            level = Level(level.value.removesuffix("_TRANSITIVE"))
        return check(level, schema, [(v, self.schema(n.id)) for v, n in live.items()])

    def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        versions = self.store.versions(subject)
        if not versions:
            raise errors.subject_not_found(subject)
        live = [v for v, n in versions.items() if not n.deleted]
        if permanent:
            if live:
                raise errors.subject_not_soft_deleted(subject)
            for v in versions:
                self.store.hard_delete(subject, v)
            self.store.delete_level(subject)
            return list(versions)
        if not live:
            raise errors.subject_soft_deleted(subject)
        for v in live:
            self.store.soft_delete(subject, v)
        return live

    def delete_version(self, subject: str, text: str, permanent: bool) -> int:
        versions = self.store.versions(subject)
        if not versions:
            raise errors.subject_not_found(subject)
        number = version_number(text)
        live = [v for v, n in versions.items() if not n.deleted]
        if number is None:
            if not live:
                raise errors.subject_soft_deleted(subject)
            number = max(live)
        if number not in versions:
            raise errors.version_not_found(subject, text)
        if permanent:
            if not versions[number].deleted:
                raise errors.version_not_soft_deleted(subject, number)
            self.store.hard_delete(subject, number)
        elif versions[number].deleted:
            raise errors.version_soft_deleted(subject, number)
        else:
            self.store.soft_delete(subject, number)
        return number

    # ------------------------------------------------------------------ levels

    def level(self, subject: str | None) -> Level:
        """The level that holds for `subject`: its own, else the global one, else BACKWARD."""
        own = self.store.level(subject) if subject is not None else None
        level = own or self.store.level(None)
        return Level(level) if level else DEFAULT
