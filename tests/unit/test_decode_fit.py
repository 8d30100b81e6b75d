"""A decoded record fitted to the table's columns (`spark/decode_fit.py`): JSON
spellings of decimals, bytes and timestamps read into their types, maps and arrays
walked, and what does not fit named by path — a bool is not an int, an int out of its
column's range is refused (Spark would wrap it around)."""

from __future__ import annotations

import datetime
import decimal

import pytest

from airflow_provider_logbus.schema import load_schema
from airflow_provider_logbus.spark.decode_fit import RejectedValue, TableFit

TABLE = TableFit(load_schema("price decimal(5,2), counts map<string, struct<n: int NOT NULL>>, flag boolean, "
                             "at timestamp_ntz, small tinyint").to_arrow())


def reason(record: dict, from_json: bool = True) -> str:
    with pytest.raises(RejectedValue) as rejected:
        TABLE.fit(record, from_json)
    return str(rejected.value)


def test_json_spellings_read_into_their_columns_types():
    assert TABLE.fit({"price": "12.345", "counts": {"x": {"n": 1}}, "flag": True, "at": "2026-11-27T10:00:00+01:00",
                      "small": -128}, from_json=True) == {
        "price": decimal.Decimal("12.35"), "counts": {"x": {"n": 1}}, "flag": True,
        "at": datetime.datetime(2026, 11, 27, 9), "small": -128}
    assert reason({"price": 1.5}, from_json=False) == (  # Avro's decimals are Decimals: a float is another type
        "does not fit the schema: price: expected decimal(5,2), got float")


def test_what_does_not_fit_is_named_by_path():
    assert reason({"counts": {"x": {"n": None}}}) == "required field missing or null: counts{}.n"
    assert reason({"price": "1000.00", "flag": 1, "small": 128, "counts": {"x": {"n": True}}}) == (
        "does not fit the schema: price: expected decimal(5,2), got str; counts{}.n: expected int, got bool; "
        "flag: expected boolean, got int; small: expected tinyint, got 128 (out of range)")
    assert reason({"at": "noon"}) == "does not fit the schema: at: expected timestamp_ntz, got str"
