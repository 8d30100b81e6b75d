"""Avro and JSON schemas the registry tests evolve: a record and its changes, each
named for what it does to the data."""

from __future__ import annotations

import json


def record(*fields: dict) -> str:
    return json.dumps({"type": "record", "name": "Click", "namespace": "logbus.tests", "fields": list(fields)})


A = {"name": "a", "type": "int"}
V1 = record(A)
ADD_OPTIONAL = record(A, {"name": "b", "type": ["null", "string"], "default": None})  # compatible both ways
ADD_REQUIRED = record(A, {"name": "b", "type": "string"})  # old data has no b: not BACKWARD
A_DEFAULT = record({"name": "a", "type": "int", "default": 0})  # FULL with V1; lets a go missing
ADD_DEFAULT_C = record(A, {"name": "c", "type": "string", "default": "x"})
REQUIRE_C = record(A, {"name": "c", "type": "string"})  # reads ADD_DEFAULT_C's data, not V1's
REMOVE_A = record({"name": "b", "type": ["null", "string"], "default": None})  # old readers need a: not FORWARD
A_AS_STRING = record({"name": "a", "type": "string"})  # neither way


def closed_object(properties: dict, required: list[str]) -> str:
    return json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", "title": "Click", "type": "object",
                       "properties": properties, "required": required, "additionalProperties": False})


JSON_V1 = closed_object({"a": {"type": "integer"}}, ["a"])
JSON_ADD_OPTIONAL = closed_object({"a": {"type": "integer"}, "b": {"type": "string"}}, ["a"])
JSON_ADD_REQUIRED = closed_object({"a": {"type": "integer"}, "b": {"type": "string"}}, ["a", "b"])
