"""The data source's own JSON parse (`spark/reader_json.py`): which values it takes,
which it leaves to Spark's `from_json`, and which raw values it keeps. That Spark's
answer is the same either way is `tests/provider/test_schema_and_rejects.py`'s."""

from __future__ import annotations

import json

import pyarrow as pa

from airflow_provider_logbus.spark.reader_json import CORRUPT, MIN_SPAN, arrow_value_type, parse_values


def struct_json(fields: list[tuple[str, object]]) -> str:
    return json.dumps({"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields]})


FLAT = struct_json([("s", "string"), ("n", "long"), ("d", "double"), ("b", "boolean"),
                    ("l", {"type": "array", "elementType": "integer", "containsNull": True}),
                    ("st", {"type": "struct", "fields": [{"name": "x", "type": "short", "nullable": True,
                                                          "metadata": {}}]})])


def parse(values: list[bytes | None], required=(), keep=False, spec=FLAT):
    parsed, kept = parse_values(pa.array(values, pa.binary()), arrow_value_type(spec), list(required), keep)
    return parsed.to_pylist(), kept.to_pylist()


def test_types_whose_json_conversion_is_sparks_own_leave_the_parse_to_spark():
    assert arrow_value_type(FLAT) is not None
    assert arrow_value_type(FLAT).field(CORRUPT).type == pa.string()
    for spark_type in ("timestamp", "date", "decimal(10,2)", "float", "binary",
                       {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True},
                       {"type": "array", "elementType": "timestamp", "containsNull": True}):
        assert arrow_value_type(struct_json([("s", "string"), ("t", spark_type)])) is None, spark_type
    assert arrow_value_type(struct_json([])) is None


def test_one_json_object_per_value_is_parsed_and_its_bytes_dropped():
    good = [json.dumps({"s": f"v{i}", "n": i, "d": i, "l": [i, None], "st": {"x": i}, "extra": [1, {"q": 2}]}).encode()
            for i in range(3)]
    parsed, kept = parse(good)
    assert [p["n"] for p in parsed] == [0, 1, 2]
    assert parsed[1] == {"s": "v1", "n": 1, "d": 1.0, "b": None, "l": [1, None], "st": {"x": 1}, CORRUPT: None}
    assert kept == [None, None, None]


def test_what_pyarrow_might_read_otherwise_goes_to_spark_with_its_bytes():
    doubtful = [
        b'{"s": 5}',                      # Spark stringifies a number for a string field
        b'{"n": "5"}', b'{"n": 5.0}', b'{"n": 99999999999999999999}', b'{"st": {"x": 70000}}',
        b'{"n": 1, "n": 2}',              # Spark takes the last key
        b'{"s": "\xff"}',                 # Spark replaces bytes that are not UTF-8
        b'{"n": 1} ', b' {"n": 1}', b'{"n": 1}\n',  # whitespace around: Spark's to parse
        b'{"n": 1}{"n": 2}',              # two objects in one value
        b"[1]", b"null", b"", None, b"not json", b'{"n": 1',
        b'{"d": Inf}', b'{"d": -NaN}',    # pyarrow reads these as numbers, Spark refuses them
        b'{"s": "x", "l": [' + b"[" * 999 + b"]" * 999 + b"]}",  # deeper than Jackson goes
        b'{"d": 1' + b"0" * 1000 + b"}",  # a number longer than Jackson reads
    ]
    for value in doubtful:
        parsed, kept = parse([value])
        assert parsed == [None] and kept == [value], value


def test_a_refused_value_costs_spark_a_small_span_not_the_whole_batch():
    good = [json.dumps({"n": i}).encode() for i in range(1000)]
    values = good[:500] + [b'{"n": "bad"}'] + good[500:]
    parsed, kept = parse(values)
    left_to_spark = [i for i, p in enumerate(parsed) if p is None]
    assert 500 in left_to_spark and len(left_to_spark) <= MIN_SPAN
    assert all(kept[i] == values[i] for i in left_to_spark)
    assert all(p["n"] == json.loads(values[i])["n"] for i, p in enumerate(parsed) if p is not None)
    assert sum(k is not None for k in kept) == len(left_to_spark)


def test_a_parsed_value_keeps_its_bytes_when_it_may_be_rejected_for_a_required_field():
    values = [b'{"s": "a", "n": 1}', b'{"s": "b"}', b'{"s": null, "n": 3}']
    parsed, kept = parse(values, required=["n"])
    assert [p["n"] for p in parsed] == [1, None, 3]
    assert kept == [None, values[1], None]
    _, kept = parse(values, keep=True)  # a nested required field: every value may be rejected
    assert kept == values
