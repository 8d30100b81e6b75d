"""Compatibility levels and the check a new schema must pass against a subject's live
versions (docs/schemas.md, "Compatibility"), as Confluent defines them: BACKWARD —
the new schema reads data written with the previous one; FORWARD — the previous one
reads data written with the new; FULL — both; the _TRANSITIVE forms against every
live version, not only the latest; NONE — no check. Avro's reader/writer rule is the
`avro` package's own (`avro.compatibility`, the Java implementation's port); JSON
Schema's is `broker.registry.jsoncompat`'s conservative subset."""

from __future__ import annotations

import enum

from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from broker.registry import jsoncompat
from broker.registry.errors import invalid_compatibility
from broker.registry.schemas import AVRO, Schema


class Level(str, enum.Enum):
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"
    NONE = "NONE"

    @classmethod
    def parse(cls, value: object) -> "Level":
        try:
            return cls(str(value).upper()) if isinstance(value, str) else cls(value)
        except ValueError:
            raise invalid_compatibility(value) from None

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        return self.value.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        return self.value.startswith(("FORWARD", "FULL"))


DEFAULT = Level.BACKWARD


def can_read(reader: Schema, writer: Schema) -> list[str]:
    """Why data written with `writer` may not be read with `reader`; empty: it may."""
    if reader.type != writer.type:
        return [f"a {reader.type} schema cannot read {writer.type} data"]
    if reader.text == writer.text:
        return []
    if reader.type == AVRO:
        result = ReaderWriterCompatibilityChecker().get_compatibility(reader.avro(), writer.avro())
        if result.compatibility == SchemaCompatibilityType.compatible:
            return []
        return [f"{m} at {'/'.join(result.locations) or '/'}" for m in result.messages] or ["incompatible"]
    return jsoncompat.can_read(reader.document, writer.document)


def check(level: Level, new: Schema, previous: list[tuple[int, Schema]]) -> list[str]:
    """Why `new` breaks `level` against `previous` (version, schema), latest last;
    empty: compatible."""
    if level == Level.NONE or not previous:
        return []
    against = previous if level.transitive else previous[-1:]
    messages = []
    for version, old in against:
        if level.backward:
            messages += [f"version {version} (BACKWARD: the new schema cannot read its data): {m}"
                         for m in can_read(new, old)]
        if level.forward:
            messages += [f"version {version} (FORWARD: it cannot read data of the new schema): {m}"
                         for m in can_read(old, new)]
    return messages
