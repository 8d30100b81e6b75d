"""The load's decoding of registry-framed values (`spark/decode_framed.py`) against a
real `logbus schema-registry` on a real ZooKeeper, with values framed by
confluent_kafka's AvroSerializer and JSONSerializer: the columns of a good value, a
record written with an older schema read into the newer table (with the table's Avro
defaults and promotions when it is declared in Avro), JSON validated against its
writer's schema, required fields checked through structs, and a reason for each value
that cannot load."""

from __future__ import annotations

import datetime
import json
import struct

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from confluent_kafka.schema_registry.json_schema import JSONSerializer

from airflow_provider_logbus.schema import load_schema
from airflow_provider_logbus.spark import registry_schemas
from airflow_provider_logbus.spark.decode_fit import RejectedValue
from airflow_provider_logbus.spark.decode_framed import decode_value as decode
from airflow_provider_logbus.registry_access import RegistryAccess
from tests.registry import schemas as s

TABLE = load_schema("a int NOT NULL, b string").to_arrow()  # the table after ADD_OPTIONAL


@pytest.fixture(autouse=True)
def no_cached_schemas():
    registry_schemas._WRITER_SCHEMAS.clear()  # each test's registry numbers its ids from 1
    yield
    registry_schemas._WRITER_SCHEMAS.clear()


def decode_value(value: bytes, url: str, table: pa.Schema = TABLE, reader: str | None = None) -> dict:
    return decode(value, RegistryAccess(url), table, reader)


def framed(registry, schema: str, record: dict, topic: str = "clicks") -> bytes:
    context = SerializationContext(topic, MessageField.VALUE)
    return AvroSerializer(SchemaRegistryClient({"url": registry.url}), schema)(record, context)


def test_a_framed_value_decodes_into_the_table_columns(registry):
    assert decode_value(framed(registry, s.ADD_OPTIONAL, {"a": 7, "b": "x"}), registry.url, TABLE) == {
        "a": 7, "b": "x"}


def test_a_record_of_an_older_schema_loads_with_the_new_field_null(registry):
    old = framed(registry, s.V1, {"a": 1})
    framed(registry, s.ADD_OPTIONAL, {"a": 2, "b": "y"})  # the subject evolves after `old` was written
    assert decode_value(old, registry.url, TABLE) == {"a": 1, "b": None}


def test_the_writer_schema_is_fetched_once_per_process(registry):
    value = framed(registry, s.V1, {"a": 1})
    decode_value(value, registry.url, TABLE)
    registry.stop()  # a second value of the same id needs no registry
    assert decode_value(value, registry.url, TABLE) == {"a": 1, "b": None}


def reason(value: bytes, url: str, table=TABLE, reader: str | None = None) -> str:
    with pytest.raises(RejectedValue) as rejected:
        decode_value(value, url, table, reader)
    return str(rejected.value)


def test_an_unknown_schema_id_is_a_reject_naming_the_id(registry):
    good = framed(registry, s.V1, {"a": 1})
    unknown = good[:1] + struct.pack(">I", 999) + good[5:]
    assert reason(unknown, registry.url) == f"schema id 999 is not in the registry at {registry.url}"


def test_unframed_and_corrupt_values_are_rejects_with_the_reason(registry):
    good = framed(registry, s.ADD_OPTIONAL, {"a": 1, "b": "hello"})
    (schema_id,) = struct.unpack(">I", good[1:5])
    assert reason(b'{"a": 1}', registry.url) == "not registry-framed: the first byte is 123, not 0"
    assert reason(b"\x00\x00", registry.url) == "not registry-framed: 2 bytes, shorter than the 5-byte header"
    assert reason(b"", registry.url) == "empty value"
    truncated = reason(good[:-2], registry.url)
    assert truncated.startswith(f"does not decode with schema id {schema_id}: ")
    assert reason(good + b"\x01", registry.url) == (f"does not decode with schema id {schema_id}: 1 bytes left "
                                                    f"after the record")


def test_a_record_that_does_not_fit_the_table_is_a_reject(registry):
    old = framed(registry, s.REMOVE_A, {"b": "x"})  # no a, which the table requires
    assert reason(old, registry.url) == "required field missing or null: a"
    as_string = framed(registry, s.A_AS_STRING, {"a": "seven"}, topic="other")
    assert reason(as_string, registry.url) == "does not fit the schema: a: expected int, got str"


def json_framed(registry, schema: str, record, topic: str = "json-clicks") -> bytes:
    client = SchemaRegistryClient({"url": registry.url})
    return JSONSerializer(schema, client)(record, SerializationContext(topic, MessageField.VALUE))


EVENT = json.dumps({"type": "object", "properties": {
    "a": {"type": "integer"}, "at": {"type": "string", "format": "date-time"},
    "day": {"type": "string", "format": "date"}, "blob": {"type": "string", "contentEncoding": "base64"},
    "geo": {"type": ["object", "null"], "properties": {"lat": {"type": ["number", "null"]}}},
    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["a"]})
EVENT_TABLE = load_schema("a int NOT NULL, at timestamp, day date, blob binary, geo struct<lat: double NOT NULL>, "
                          "tags array<string>").to_arrow()


def test_a_json_schema_value_decodes_into_the_columns_with_their_types(registry):
    value = json_framed(registry, EVENT, {"a": 1, "at": "2026-11-27T08:00:00Z", "day": "2026-11-27",
                                          "blob": "aGk=", "geo": {"lat": 52}, "tags": ["x"]})
    assert decode_value(value, registry.url, EVENT_TABLE) == {
        "a": 1, "at": datetime.datetime(2026, 11, 27, 8, tzinfo=datetime.timezone.utc),
        "day": datetime.date(2026, 11, 27), "blob": b"hi", "geo": {"lat": 52.0}, "tags": ["x"]}


def test_a_json_value_its_schema_does_not_validate_or_that_does_not_fit_the_table_is_a_reject(registry):
    good = json_framed(registry, s.JSON_V1, {"a": 1})
    (schema_id,) = struct.unpack(">I", good[1:5])
    assert reason(good[:5] + b'{"a": 1.5}', registry.url) == (f"does not validate against schema id {schema_id}: "
                                                              f"a: 1.5 is not of type 'integer'")
    assert reason(good[:5] + b"\xff", registry.url).startswith(f"does not decode with schema id {schema_id}: "
                                                               f"not valid JSON: ")
    assert reason(json_framed(registry, s.JSON_V1, {"a": 1 << 40}), registry.url) == (
        "does not fit the schema: a: expected int, got 1099511627776 (out of range)")
    nested_null = json_framed(registry, EVENT, {"a": 1, "geo": {"lat": None}, "at": "yesterday"})
    assert reason(nested_null, registry.url, EVENT_TABLE) == "required field missing or null: geo.lat"


def test_a_nested_required_field_is_checked_in_avro_records_too(registry):
    writer = json.dumps({"type": "record", "name": "Click", "namespace": "logbus.tests", "fields": [
        {"name": "a", "type": "int"},
        {"name": "geo", "type": {"type": "record", "name": "Geo", "fields": [
            {"name": "lat", "type": ["null", "double"], "default": None}]}}]})
    table = load_schema("a int NOT NULL, geo struct<lat: double NOT NULL>").to_arrow()
    assert reason(framed(registry, writer, {"a": 1, "geo": {"lat": None}}), registry.url, table) == (
        "required field missing or null: geo.lat")


READER = json.dumps({"type": "record", "name": "Click", "namespace": "logbus.tests", "fields": [
    {"name": "a", "type": "long"}, {"name": "f", "type": "double", "default": 0.5},
    {"name": "geo", "type": {"type": "record", "name": "Geo", "fields": [
        {"name": "lat", "type": "double"}, {"name": "zone", "type": "string", "default": "utc"}]},
     "default": {"lat": 0.0, "zone": "utc"}}]})


def test_an_avro_table_schema_resolves_with_defaults_and_promotions_through_nested_records(registry, tmp_path):
    table_file = tmp_path / "click.json"
    table_file.write_text(READER)
    table = load_schema(str(table_file)).to_arrow()
    writer = json.dumps({"type": "record", "name": "Click", "namespace": "logbus.tests", "fields": [
        {"name": "a", "type": "int"}, {"name": "f", "type": "float"},
        {"name": "geo", "type": {"type": "record", "name": "Geo", "fields": [{"name": "lat", "type": "float"}]}}]})
    value = framed(registry, writer, {"a": 7, "f": 1.5, "geo": {"lat": 2.5}})
    assert decode_value(value, registry.url, table, READER) == {"a": 7, "f": 1.5, "geo": {"lat": 2.5, "zone": "utc"}}
    assert decode_value(framed(registry, s.V1, {"a": 8}, topic="v1"), registry.url, table, READER) == {
        "a": 8, "f": 0.5, "geo": {"lat": 0.0, "zone": "utc"}}
    other = json.dumps({"type": "record", "name": "Other", "fields": [{"name": "a", "type": "int"}]})
    other_value = framed(registry, other, {"a": 9}, topic="other")
    (other_id,) = struct.unpack(">I", other_value[1:5])
    assert reason(other_value, registry.url, table, READER) == (
        f"schema id {other_id} does not resolve to the table's Avro schema: the writer's record Other is not the "
        f"table's logbus.tests.Click (records are matched by full name or an alias of the table's)")
