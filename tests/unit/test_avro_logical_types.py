"""Avro logical types without a column type of their own — `time-millis`, `time-micros`,
`uuid` — are columns of their underlying type (as Spark's Avro reader makes them), and
the values fastavro decodes them into (`datetime.time`, `uuid.UUID`) fit those columns:
before, every record with such a field went to rejects as "does not fit the schema"."""

from __future__ import annotations

import datetime
import io
import json
import uuid

import fastavro
import pyarrow as pa

from airflow_provider_logbus.schema import load_schema
from airflow_provider_logbus.spark.decode_avro import read_avro
from airflow_provider_logbus.spark.decode_fit import TableFit
from airflow_provider_logbus.spark.registry_schemas import WriterSchema

SCHEMA = {"type": "record", "name": "visit", "fields": [
    {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "seen", "type": ["null", {"type": "array", "items": {"type": "string", "logicalType": "uuid"}}]},
]}


def test_time_and_uuid_fields_load_as_their_underlying_types(tmp_path):
    path = tmp_path / "visit.avsc.json"
    path.write_text(json.dumps(SCHEMA))
    columns = load_schema(path).to_arrow()
    assert [f.type for f in columns] == [pa.int32(), pa.int64(), pa.string(), pa.list_(pa.string())]
    at, visit, other = datetime.time(12, 34, 56, 789012), uuid.uuid4(), uuid.uuid4()
    body = io.BytesIO()
    parsed = fastavro.parse_schema(SCHEMA)
    fastavro.schemaless_writer(body, parsed, {"t_ms": at, "t_us": at, "id": visit, "seen": [other]})

    record = read_avro(body.getvalue(), WriterSchema(1, "AVRO", parsed))

    assert TableFit(columns).fit(record) == {"t_ms": 45_296_789, "t_us": 45_296_789_012, "id": str(visit),
                                             "seen": [str(other)]}
