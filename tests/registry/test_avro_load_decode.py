"""The load's decoding of registry-framed Avro values (`spark/decode_avro.py`) against a
real `logbus schema-registry` on a real ZooKeeper, with values framed by
confluent_kafka's AvroSerializer: the columns of a good value, a record written with an
older schema read into the newer table, and a reason for each value that cannot load."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from airflow_provider_logbus.spark import decode_avro
from airflow_provider_logbus.spark.decode_avro import RejectedValue, decode_value
from tests.registry import schemas as s

TABLE = [("a", "int", False), ("b", "string", True)]  # the table after ADD_OPTIONAL: a NOT NULL, b


@pytest.fixture(autouse=True)
def no_cached_schemas():
    decode_avro._WRITER_SCHEMAS.clear()  # each test's registry numbers its ids from 1
    yield
    decode_avro._WRITER_SCHEMAS.clear()


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


def reason(value: bytes, url: str, table=TABLE) -> str:
    with pytest.raises(RejectedValue) as rejected:
        decode_value(value, url, table)
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


def test_a_json_schema_framed_value_is_a_reject_not_yet_decoded(registry):
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    client = SchemaRegistryClient({"url": registry.url})
    value = JSONSerializer(s.JSON_V1, client)({"a": 1}, SerializationContext("json-clicks", MessageField.VALUE))
    (schema_id,) = struct.unpack(">I", value[1:5])
    assert reason(value, registry.url) == f"schema id {schema_id} is JSON, not Avro"
