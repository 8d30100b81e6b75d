"""The registry's compatibility rules as pure functions (docs/schemas.md,
"Compatibility"): each level's direction and reach over Avro versions, and the JSON
Schema subset — what it accepts, and that anything it does not check is refused."""

from __future__ import annotations

import json

import pytest

from broker.registry.compatibility import Level, check
from broker.registry.errors import RegistryError
from broker.registry.jsoncompat import can_read
from broker.registry.schemas import parse
from tests.registry import schemas as s


def avro(text: str):
    return parse(text)


@pytest.mark.parametrize("level, new, refused", [
    (Level.BACKWARD, s.ADD_REQUIRED, True), (Level.BACKWARD, s.REMOVE_A, False),
    (Level.FORWARD, s.ADD_REQUIRED, False), (Level.FORWARD, s.REMOVE_A, True),
    (Level.FULL, s.ADD_OPTIONAL, False), (Level.FULL, s.ADD_REQUIRED, True), (Level.FULL, s.REMOVE_A, True),
    (Level.NONE, s.A_AS_STRING, False),
])
def test_each_level_checks_its_direction_against_the_latest(level, new, refused):
    messages = check(level, avro(new), [(1, avro(s.V1))])
    assert bool(messages) is refused
    assert all(m.startswith("version 1 (") for m in messages)


def test_transitive_levels_look_back_past_the_latest():
    history = [(1, avro(s.V1)), (2, avro(s.ADD_DEFAULT_C))]
    assert check(Level.BACKWARD, avro(s.REQUIRE_C), history) == []
    [message] = check(Level.BACKWARD_TRANSITIVE, avro(s.REQUIRE_C), history)
    assert message.startswith("version 1 (BACKWARD")


def test_a_level_is_one_of_confluents_names():
    assert Level.parse("full_transitive") == Level.FULL_TRANSITIVE
    with pytest.raises(RegistryError) as refused:
        Level.parse("SIDEWAYS")
    assert refused.value.code == 42203


def obj(properties: dict, required=(), closed=True, **more) -> dict:
    schema = {"type": "object", "properties": properties, "required": list(required), **more}
    return {**schema, "additionalProperties": False} if closed else schema


INT, STR, NUM = {"type": "integer"}, {"type": "string"}, {"type": "number"}


@pytest.mark.parametrize("reader, writer, compatible", [
    (obj({"a": INT, "b": STR}, ["a"]), obj({"a": INT}, ["a"]), True),  # optional property added to a closed writer
    (obj({"a": INT, "b": STR}, ["a"], closed=False), obj({"a": INT}, ["a"], closed=False), False),  # open writer
    (obj({"a": INT, "b": STR}, ["a", "b"]), obj({"a": INT, "b": STR}, ["a"]), False),  # newly required
    (obj({"a": INT}, closed=False), obj({"a": INT, "b": STR}), True),  # removed: an open reader takes it
    (obj({"a": INT}), obj({"a": INT, "b": STR}), False),  # removed: a closed reader refuses it
    (obj({"a": NUM}), obj({"a": INT}), True),  # widened
    (obj({"a": INT}), obj({"a": NUM}), False),  # narrowed
    (obj({"a": {"enum": ["x", "y"]}}), obj({"a": {"enum": ["x"]}}), True),
    (obj({"a": {"enum": ["x"]}}), obj({"a": {"enum": ["x", "y"]}}), False),
    ({"type": "array", "items": NUM}, {"type": "array", "items": INT}, True),
    ({"type": "array", "items": INT}, {"type": "array", "items": STR}, False),
    (obj({"a": {"type": "string", "maxLength": 3}}), obj({"a": {"type": "string", "maxLength": 4}}), False),  # unchecked
    (obj({"a": STR}, title="new title"), obj({"a": STR}, title="old"), True),  # annotations don't matter
    (True, obj({"a": STR}), True), ({"type": "string"}, True, False),
])
def test_json_schema_subset(reader, writer, compatible):
    problems = can_read(reader, writer)
    assert (problems == []) is compatible, problems


def test_identity_is_the_canonical_text_of_one_type():
    spaced = json.dumps(json.loads(s.V1), indent=2)
    assert parse(spaced).fingerprint == parse(s.V1).fingerprint
    assert parse(s.ADD_OPTIONAL).fingerprint != parse(s.V1).fingerprint
    assert parse('{"type": "string"}', "JSON").fingerprint != parse('{"type": "string"}').fingerprint
