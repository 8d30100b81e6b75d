"""Declared value schemas: DDL and JSON files in, arrow and DDL out, and which changes a
table may take (airflow_provider_logbus.schema; pure Python, no Spark)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from airflow_provider_logbus.schema import SchemaError, ValueSchema, check_evolution, load_schema

UTC_US = pa.timestamp("us", tz="UTC")


def test_ddl_gives_arrow_fields_nullable_unless_not_null():
    schema = load_schema("server string, n long, ts_ms long NOT NULL").to_arrow()
    assert schema == pa.schema([pa.field("server", pa.string()), pa.field("n", pa.int64()),
                                pa.field("ts_ms", pa.int64(), nullable=False)])


def test_ddl_knows_every_documented_type():
    schema = load_schema(
        "s string, i int, j integer, l long, b bigint, h short, y byte, d double, f float, ok boolean, "
        "raw binary, day date, at timestamp, price decimal(12,2), tags array<string>, "
        "attrs map<string, long>, geo struct<lat: double, lon: double NOT NULL>").to_arrow()
    assert [f.type for f in schema] == [
        pa.string(), pa.int32(), pa.int32(), pa.int64(), pa.int64(), pa.int16(), pa.int8(), pa.float64(),
        pa.float32(), pa.bool_(), pa.binary(), pa.date32(), UTC_US, pa.decimal128(12, 2),
        pa.list_(pa.field("element", pa.string())), pa.map_(pa.string(), pa.int64()),
        pa.struct([pa.field("lat", pa.float64()), pa.field("lon", pa.float64(), nullable=False)])]


def test_ddl_is_case_insensitive_and_accepts_quoted_names_and_comments():
    schema = load_schema("`event type` STRING COMMENT 'what happened', N BIGINT not null").to_arrow()
    assert schema.names == ["event type", "N"]
    assert not schema.field("N").nullable


def test_to_ddl_round_trips():
    text = ("server string, n long NOT NULL, `odd name` decimal(10,2), tags array<struct<k: string, v: int>>, "
            "m map<string, array<double>>, geo struct<lat: double NOT NULL>, at timestamp, day date")
    schema = load_schema(text)
    again = load_schema(schema.to_ddl())
    assert again.to_arrow().equals(schema.to_arrow())
    assert again.to_ddl() == schema.to_ddl()


def test_to_ddl_is_spark_spelling():
    assert load_schema("n long NOT NULL, s string").to_ddl() == "`n` bigint NOT NULL, `s` string"


@pytest.mark.parametrize("ddl, where", [
    ("n long,", "expected a field name at position 7, found the end"),
    ("n lon", "unknown type 'lon' at position 2"),
    ("n long NOT", "expected NULL after NOT at position 10"),
    ("n struct<a int", "expected ',' or '>' at position 14, found the end"),
    ("n long x", "expected ',' or the end of the schema at position 7, found 'x'"),
    ("n long; m int", "unexpected character ';' at position 6"),
    ("m map<int, string>", "map keys must be string"),
    ("p decimal(40,2)", "precision must be 1..38"),
    ("n long, n int", "field 'n' is declared twice"),
    ("   ", "schema DDL is empty"),
])
def test_unparseable_ddl_names_the_position_and_token(ddl, where):
    with pytest.raises(SchemaError, match=where.replace("(", r"\(").replace(")", r"\)")):
        load_schema(ddl)


def test_json_schema_file(tmp_path):
    path = tmp_path / "event.json"
    path.write_text(json.dumps({
        "type": "object",
        "properties": {
            "n": {"type": "integer"}, "score": {"type": "number"}, "server": {"type": "string"},
            "at": {"type": "string", "format": "date-time"}, "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "geo": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
            "note": {"type": ["string", "null"]},
        },
        "required": ["n", "note"],
    }))
    schema = load_schema(str(path)).to_arrow()
    assert schema == pa.schema([
        pa.field("n", pa.int64(), nullable=False), pa.field("score", pa.float64()), pa.field("server", pa.string()),
        pa.field("at", UTC_US), pa.field("ok", pa.bool_()), pa.field("tags", pa.list_(pa.field("element", pa.string()))),
        pa.field("geo", pa.struct([pa.field("lat", pa.float64(), nullable=False)])),
        pa.field("note", pa.string()),  # required, but null is allowed
    ])


def test_avro_record_file(tmp_path):
    path = tmp_path / "event.avsc.json"
    path.write_text(json.dumps({
        "type": "record", "name": "event",
        "fields": [
            {"name": "n", "type": "long"},
            {"name": "server", "type": ["null", "string"], "default": None},
            {"name": "ratio", "type": "float"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}]},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "attrs", "type": {"type": "map", "values": "int"}},
            {"name": "geo", "type": ["null", {"type": "record", "name": "geo",
                                              "fields": [{"name": "lat", "type": "double"}]}]},
        ]}))
    schema = load_schema(path).to_arrow()
    assert schema == pa.schema([
        pa.field("n", pa.int64(), nullable=False), pa.field("server", pa.string()),
        pa.field("ratio", pa.float32(), nullable=False), pa.field("at", UTC_US, nullable=False),
        pa.field("price", pa.decimal128(9, 2)),
        pa.field("tags", pa.list_(pa.field("element", pa.string())), nullable=False),
        pa.field("attrs", pa.map_(pa.string(), pa.int32()), nullable=False),
        pa.field("geo", pa.struct([pa.field("lat", pa.float64(), nullable=False)])),
    ])


def test_json_files_round_trip_through_ddl(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
    schema = load_schema(path)
    assert schema.to_ddl() == "`n` bigint NOT NULL"
    assert load_schema(schema.to_ddl()).to_arrow().equals(schema.to_arrow())


@pytest.mark.parametrize("document, message", [
    ({"type": "object", "properties": {"n": {"type": "int"}}}, "n: unknown JSON Schema type 'int'"),
    ({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["m"]}, "\"required\" names 'm'"),
    ({"type": "record", "fields": [{"name": "n", "type": ["null", "long", "string"]}]}, "n: union"),
    ({"type": "record", "fields": [{"name": "n", "type": "uuid-ish"}]}, "n: unknown or unsupported Avro type"),
    ({"type": "array"}, "expected a JSON Schema object"),
])
def test_bad_json_schema_names_the_field(tmp_path, document, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(SchemaError, match=message.replace("(", r"\(")):
        load_schema(path)


def test_schema_file_that_is_not_json_names_the_position(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"type": "object",\n "properties": {')
    with pytest.raises(SchemaError, match=r"broken.json is not valid JSON: .* line 2 column"):
        load_schema(path)


def test_missing_schema_file_is_named(tmp_path):
    with pytest.raises(SchemaError, match="does not exist"):
        load_schema(tmp_path / "nope.json")


# ------------------------------------------------------------------ evolution

def arrow(ddl: str) -> pa.Schema:
    return ValueSchema.from_ddl(ddl).to_arrow()


def test_same_schema_adds_nothing():
    assert check_evolution(arrow("a string, n long NOT NULL"), arrow("a string, n long NOT NULL")) == []


def test_new_optional_fields_are_returned_to_add():
    assert check_evolution(arrow("a string"), arrow("a string, b long, geo struct<lat: double>")) == ["b", "geo"]


def test_a_new_optional_nested_field_returns_its_top_level_field_to_union():
    assert check_evolution(arrow("a int, geo struct<lat: double>"),
                           arrow("a int, geo struct<lat: double, lon: double>")) == ["geo"]
    assert check_evolution(arrow("items array<struct<k: int>>"), arrow("items array<struct<k: int, v: string>>")) == [
        "items"]


def test_a_new_required_nested_field_is_refused_with_its_path():
    with pytest.raises(SchemaError, match="field 'geo.lon' \\(double NOT NULL\\) is added as required"):
        check_evolution(arrow("geo struct<lat: double>"), arrow("geo struct<lat: double, lon: double NOT NULL>"))


def test_fields_dropped_from_the_declared_schema_are_fine():
    assert check_evolution(arrow("a string, b long"), arrow("a string")) == []


@pytest.mark.parametrize("old, new", [
    ("n int", "n long"), ("x float", "x double"), ("p decimal(9,2)", "p decimal(12,2)"),
    ("t array<int>", "t array<long>"), ("m map<string, float>", "m map<string, double>"),
    ("n long NOT NULL", "n long"), ("n smallint", "n int"), ("n tinyint", "n long"),
])
def test_widenings_and_relaxing_required_are_allowed_and_returned_to_union(old, new):
    """The table's column must change with them: a file of the declared types would not
    fit the old column (found by a registry subject whose new version gave a required
    field a default, or promoted int to long, as Avro allows)."""
    assert check_evolution(arrow(old), arrow(new)) == [old.split()[0]]


@pytest.mark.parametrize("old, new, message", [
    ("n long", "n int", "field 'n' changes type from bigint to int: a narrowing"),
    ("n int", "n smallint", "field 'n' changes type from int to smallint: a narrowing"),
    ("n long", "n string", "field 'n' changes type from bigint to string: not a widening"),
    ("x double", "x float", "field 'x' changes type from double to float: a narrowing"),
    ("p decimal(9,2)", "p decimal(12,3)", "from decimal(9,2) to decimal(12,3): not a widening"),
    ("p decimal(12,2)", "p decimal(9,2)", "a narrowing"),
    ("n int", "n double", "from int to double: not a widening"),
    ("g struct<a: int>", "g string", "field 'g' changes type from struct<`a`: int> to string"),
    ("g struct<a: int>", "g struct<a: string>", "field 'g.a' changes type from int to string"),
    ("t array<long>", "t array<int>", "field 't.element' changes type from bigint to int"),
])
def test_incompatible_type_changes_name_the_field_and_both_types(old, new, message):
    with pytest.raises(SchemaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_evolution(arrow(old), arrow(new))


def test_required_field_added_is_refused():
    with pytest.raises(SchemaError, match="field 'b' \\(bigint NOT NULL\\) is added as required"):
        check_evolution(arrow("a string"), arrow("a string, b long NOT NULL"))


def test_optional_field_made_required_is_refused():
    with pytest.raises(SchemaError, match="field 'a' \\(string -> string NOT NULL\\) is made required"):
        check_evolution(arrow("a string"), arrow("a string NOT NULL"))


def test_storage_variants_of_one_type_compare_equal():
    current = pa.schema([pa.field("s", pa.large_string()), pa.field("t", pa.timestamp("ns", tz="UTC"))])
    assert check_evolution(current, arrow("s string, t timestamp")) == []
