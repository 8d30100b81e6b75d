"""JSON Schema compatibility: a conservative subset (docs/schemas.md, "JSON Schema").
Whether every document valid under the writer's schema is valid under the reader's,
decided only where that is plain; anything else is refused with the reason, never
guessed compatible.

Checked, recursively through `properties`, `additionalProperties` and `items`:
- `type`: the reader's types include the writer's ("number" includes "integer");
  a schema without `type` (or `true`, `{}`) reads anything.
- objects: every property the reader requires, the writer requires; a property the
  reader declares and the writer does not is readable only if the writer is closed
  (`additionalProperties: false`, so no such value is ever written) or the reader
  accepts anything there; a property the writer declares and the reader does not is
  readable only if the reader is open (its `additionalProperties` then reads it);
  a closed reader cannot read an open writer.
- `enum`: the reader's values include the writer's.
- `items`: the reader's item schema reads the writer's.
- Any other keyword (`pattern`, `minimum`, `format`, `oneOf`, `$ref`...) must be the
  same on both sides, else the change is refused as unchecked.
So, as Confluent's rules: under BACKWARD, a new optional property is compatible when
the old schema was closed; removing an optional property is compatible when the new
schema is open; a new required property, a narrowed type or a removed enum value is
not."""

from __future__ import annotations

from typing import Any

CHECKED = {"type", "properties", "required", "additionalProperties", "items", "enum"}
IGNORED = {"$schema", "$id", "title", "description", "default", "examples", "$comment"}  # no effect on validity


def can_read(reader: Any, writer: Any, at: str = "/") -> list[str]:
    """Why some document valid under `writer` may be invalid under `reader`."""
    if reader is True or reader == {} or reader == writer:
        return []
    if writer is False:
        return []
    if reader is False:
        return [f"{at}: the reader accepts nothing"]
    if writer is True or writer == {}:
        return [f"{at}: the writer accepts anything, the reader does not"]
    problems = [f"{at}: keyword '{k}' differs (not checked: refused)"
                for k in sorted((reader.keys() | writer.keys()) - CHECKED - IGNORED) if reader.get(k) != writer.get(k)]
    problems += _types(reader, writer, at)
    if "enum" in reader and not ("enum" in writer and all(v in reader["enum"] for v in writer["enum"])):
        problems.append(f"{at}: the reader's enum does not include every value the writer may write")
    if "items" in reader or "items" in writer:
        problems += can_read(reader.get("items", True), writer.get("items", True), f"{at}items/")
    if _may_be_object(reader) or _may_be_object(writer):
        problems += _objects(reader, writer, at)
    return problems


def _type_set(schema: dict) -> set[str] | None:
    types = schema.get("type")
    if types is None:
        return None
    return {types} if isinstance(types, str) else set(types)


def _types(reader: dict, writer: dict, at: str) -> list[str]:
    readable, written = _type_set(reader), _type_set(writer)
    if readable is None:
        return []
    if written is None:
        return [f"{at}: the writer allows any type, the reader only {sorted(readable)}"]
    if "number" in readable:
        readable.add("integer")
    missing = written - readable
    return [f"{at}: the reader does not take type {', '.join(sorted(missing))}"] if missing else []


def _may_be_object(schema: dict) -> bool:
    types = _type_set(schema)
    return types is None or "object" in types


def _objects(reader: dict, writer: dict, at: str) -> list[str]:
    problems = []
    reader_props, writer_props = reader.get("properties", {}), writer.get("properties", {})
    reader_rest, writer_rest = reader.get("additionalProperties", True), writer.get("additionalProperties", True)
    for name in sorted(set(reader.get("required", [])) - set(writer.get("required", []))):
        problems.append(f"{at}{name}: required by the reader, not by the writer")
    for name, schema in sorted(reader_props.items()):
        if name in writer_props:
            problems += can_read(schema, writer_props[name], f"{at}{name}/")
        elif writer_rest is not False:
            problems += [f"{at}{name}: added, but the writer is open (additionalProperties not false): {p}"
                         for p in can_read(schema, writer_rest)]
    for name, schema in sorted(writer_props.items()):
        if name not in reader_props:
            problems += [f"{at}{name}: removed, and the reader's additionalProperties refuses it: {p}"
                         for p in can_read(reader_rest, schema, f"{at}{name}/")]
    if writer_rest is not False:
        problems += [f"{at}: additional properties the writer allows: {p}"
                     for p in can_read(reader_rest, writer_rest, f"{at}(additional)/")]
    return problems
