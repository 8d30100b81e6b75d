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
        """One version (`latest`: the highest live one), reading only the nodes needed."""
        number = version_number(text)
        numbers = self.store.numbers(subject)
        for candidate in (reversed(numbers) if number is None else [number] if number in numbers else []):
            node = self.store.version(subject, candidate)
            if node is not None and (deleted or not node.deleted):
                return described(subject, candidate, node.id, self.schema(node.id))
        self.live(subject, deleted)  # 40401 if the subject has no (live) version
        raise errors.version_not_found(subject, text)

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
        level = self.level(subject)
        for _ in range(REGISTER_ATTEMPTS):
            numbers = self.store.numbers(subject)
            if self.store.used_by(schema_id, subject) and any(
                    (node := self.store.version(subject, v)) is not None and not node.deleted and node.id == schema_id
                    for v in reversed(numbers)):
                return schema_id
            problems = check(level, schema, self._against(subject, numbers, level))
            if problems:
                raise errors.incompatible(problems)
            if self.store.add_version(subject, max(numbers, default=0) + 1, schema_id):
                return schema_id
        raise errors.store_error(f"{REGISTER_ATTEMPTS} concurrent registrations under subject '{subject}' won")

    def _against(self, subject: str, numbers: list[int], level: Level) -> list[tuple[int, Schema]]:
        """The live versions `level` checks a new schema against, latest last: none for
        NONE, every one for a transitive level, else the latest (read from the top down,
        so registering costs a few reads however many versions the subject has)."""
        if level == Level.NONE:
            return []
        found = []
        for number in reversed(numbers):
            node = self.store.version(subject, number)
            if node is not None and not node.deleted:
                found.insert(0, (number, self.schema(node.id)))
                if not level.transitive:
                    break
        return found

    def compatibility(self, subject: str, schema: Schema, version: str | None) -> list[str]:
        """Why `schema` would be refused: against one version (`version`, "latest") in the
        level's direction(s), or against what registering would check."""
        level = self.level(subject)
        if version is None:
            return check(level, schema, self._against(subject, self.store.numbers(subject), level))
        old = self.version(subject, version)
        return check(Level(level.value.removesuffix("_TRANSITIVE")), schema,
                     [(old["version"], self.schema(old["id"]))])

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
