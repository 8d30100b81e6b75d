"""Declared schemas, dead letters and the staging layouts of the load job, run in-process
on the shared SparkSession against real brokers (values produced raw, so malformed
ones can be sent)."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from broker.client.producer import Producer
from broker.common.columns_arrow import headers_type
from broker.common.message import iter_messages

from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.plan import Range, ranges_to_json
from airflow_provider_logbus.schema import load_schema
from airflow_provider_logbus.spark.decode import json_schema
from airflow_provider_logbus.spark.load_job import COUNTS_FILE, REJECTS_DIR, arguments, main, read_ranges, run_load
from airflow_provider_logbus.spark.reader_json import MIN_SPAN, PARSED_IN_READER
from harness.process import wait_until

pytestmark = pytest.mark.slow

HOUR = 3_600_000
BASE = int(datetime(2024, 1, 1, 10, 0, tzinfo=timezone.utc).timestamp() * 1000)
SCHEMA = "server string, n long, ts_ms long NOT NULL"

GOOD = [json.dumps({"server": f"web-{i}", "n": i, "ts_ms": BASE + i}).encode() for i in range(12)]
BAD = {  # value -> what the error must say
    b"this is not json": "not valid JSON",
    b'[{"server": "web-x", "n": 1, "ts_ms": 1}]': "not a JSON object: an array",
    b'{"server": "web-x", "n": "twelve", "ts_ms": 1}': "does not fit the schema: n: expected bigint, got string",
    b'{"server": "web-x", "n": 13}': "required field missing or null: ts_ms",
    b'{"server": "web-x", "n": 14, "ts_ms": null}': "required field missing or null: ts_ms",
    b"": "empty value",
}


def send_raw(zookeeper: str, topic: str, values: list[bytes], first_ts: int = BASE, spacing_ms: int = 60_000) -> dict:
    """Send `values` in order, alternating partitions, stamped `spacing_ms` apart; wait
    until all are visible and return {(partition, offset): value}."""
    with Producer(zookeeper=zookeeper, acks=1, monitoring=False) as producer:
        for i, value in enumerate(values):
            producer.send(topic, value, timestamp=first_ts + i * spacing_ms, partition=i % 2)
    return wait_until(lambda: _visible(zookeeper, topic, len(values)), 30, f"{len(values)} messages in {topic}")


def _visible(zookeeper: str, topic: str, count: int) -> dict | None:
    found = {}
    with LogbusCluster(zookeeper) as cluster:
        for p, o in cluster.partition_offsets(topic).items():
            for base, buf in cluster.read_range(topic, p, o.earliest, o.latest):
                found.update({(p, m.offset): bytes(m.value) for m in iter_messages(buf, base)})
    return found if len(found) == count else None


def ranges_of(zookeeper: str, topic: str) -> list[Range]:
    with LogbusCluster(zookeeper) as cluster:
        return [Range(topic, p, o.earliest, o.latest) for p, o in sorted(cluster.partition_offsets(topic).items())]


def rows(path, columns=None) -> list[dict]:
    return ds.dataset(str(path), format="parquet", partitioning="hive").to_table(columns=columns).to_pylist()


@pytest.fixture(scope="module")
def mixed(module_cluster):
    """Topic `mixed`: good values interleaved with every kind of bad one."""
    values = []
    bad = list(BAD)
    for i, good in enumerate(GOOD):
        values.append(good)
        if i < len(bad):
            values.append(bad[i])
    return module_cluster.zookeeper, send_raw(module_cluster.zookeeper, "mixed", values)


def load(spark, zookeeper, topic, staging, **kwargs) -> dict:
    return run_load(spark, ranges_of(zookeeper, topic), str(staging), zookeeper=zookeeper, **kwargs)


def test_malformed_values_land_in_rejects_with_their_offsets_and_reason(spark, mixed, tmp_path):
    zookeeper, messages = mixed
    at_the_limit = len(BAD) / len(messages)  # a rate equal to the limit loads
    result = load(spark, zookeeper, "mixed", tmp_path / "s", value_format="json", schema=SCHEMA,
                  max_reject_rate=at_the_limit)

    rejects = rows(tmp_path / "s" / REJECTS_DIR)
    assert {(r["partition"], r["offset"]): r["value"] for r in rejects} == {
        k: v for k, v in messages.items() if v in BAD}
    for r in rejects:
        assert BAD[r["value"]] in r["error"], r
        assert r["topic"] == "mixed" and r["timestamp"] is not None
    data = rows(tmp_path / "s", ["partition", "offset", "server", "n", "ts_ms"])
    assert {(r["partition"], r["offset"]) for r in data} == {k for k, v in messages.items() if v in GOOD}
    assert sorted(r["n"] for r in data) == list(range(len(GOOD)))

    on_disk = json.loads((tmp_path / "s" / COUNTS_FILE).read_text())
    assert on_disk == result
    assert result["row_count"] == len(GOOD) and result["rejected_count"] == len(BAD)
    assert sum(c["count"] for c in result["counts"] + result["rejected"]) == len(messages)
    assert {c["window_start"] % 600_000 for c in result["rejected"]} == {0}
    assert result["schema_source"] == "declared"
    assert load_schema(result["schema"]).to_arrow() == load_schema(SCHEMA).to_arrow()


def test_reject_rate_over_the_limit_fails_the_job_and_names_the_first_errors(spark, mixed, tmp_path, caplog,
                                                                             monkeypatch):
    zookeeper, messages = mixed
    monkeypatch.setattr(spark, "stop", lambda: None)  # main() gets the shared session and stops it at the end
    limit = len(BAD) / len(messages) - 0.01  # 6 of 18 rejected: 33.33% > 32.33%
    with caplog.at_level(logging.ERROR, logger="logbus.load_job"):
        exit_code = main(["--ranges", ranges_to_json(ranges_of(zookeeper, "mixed")), "--zookeeper", zookeeper,
                          "--staging", str(tmp_path / "s"), "--schema", SCHEMA, "--max-reject-rate", str(limit)])
    assert exit_code == 1
    assert (f"{len(BAD)} of {len(messages)} values of mixed rejected (33.33%) — over max_reject_rate 32.33%; "
            "first errors: partition 1 offset 0: not valid JSON; partition 1") in caplog.text
    assert f"rejects are in {tmp_path / 's' / REJECTS_DIR}" in caplog.text
    assert not (tmp_path / "s" / COUNTS_FILE).exists()  # this attempt can never be committed
    assert len(rows(tmp_path / "s" / REJECTS_DIR)) == len(BAD)


def test_reject_rate_must_be_a_fraction():
    with pytest.raises(SystemExit):
        arguments().parse_args(["--ranges", "[]", "--staging", "/tmp/x", "--max-reject-rate", "5"])
    assert arguments().parse_args(["--ranges", "[]", "--staging", "/tmp/x"]).max_reject_rate == 1.0


def test_the_operator_passes_layout_reject_rate_and_a_schema_file_as_ddl(tmp_path, monkeypatch):
    from airflow_provider_logbus.operators.spark_load import LogbusSparkLoadOperator

    monkeypatch.setenv("AIRFLOW_CONN_LOGBUS_DEFAULT",
                       json.dumps({"conn_type": "logbus", "extra": {"zookeeper": "127.0.0.1:2181/x"}}))
    schema_file = tmp_path / "event.json"
    schema_file.write_text(json.dumps({"type": "record", "name": "e", "fields": [{"name": "n", "type": "long"}]}))
    operator = LogbusSparkLoadOperator(task_id="load", table="t", warehouse=str(tmp_path), schema=str(schema_file),
                                       max_reject_rate="0.05", leader_wait="20")
    args = operator.application_args([], tmp_path / "staging", "iceberg")
    options = dict(zip(args[::2], args[1::2]))
    assert options["--schema"] == "`n` bigint NOT NULL"
    assert options["--layout"] == "iceberg" and options["--max-reject-rate"] == "0.05"
    assert options["--leader-wait"] == "20.0"
    assert {"max_reject_rate", "leader_wait"} <= set(LogbusSparkLoadOperator.template_fields)
    operator.leader_wait = "soon"
    with pytest.raises(ValueError, match="leader_wait must be a number of seconds, not 'soon'"):
        operator.application_args([], tmp_path / "staging", "iceberg")


def test_the_load_jobs_leader_wait_is_seconds_at_least_zero():
    assert arguments().parse_args(["--ranges", "[]", "--staging", "/tmp/x"]).leader_wait == 60.0
    assert arguments().parse_args(["--ranges", "[]", "--staging", "/tmp/x", "--leader-wait", "0"]).leader_wait == 0
    with pytest.raises(SystemExit):
        arguments().parse_args(["--ranges", "[]", "--staging", "/tmp/x", "--leader-wait", "-1"])


def test_inferred_schema_is_logged_and_recorded(spark, mixed, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="logbus.load_job"):
        result = load(spark, mixed[0], "mixed", tmp_path / "s", value_format="json")
    assert result["schema_source"] == "inferred"
    # the sample holds n = "twelve": Spark widens n to string, which is why schemas are declared
    assert load_schema(result["schema"]).to_arrow() == pa.schema(
        [("n", pa.string()), ("server", pa.string()), ("ts_ms", pa.int64())])
    assert f"Inferred schema: {result['schema']}" in caplog.text
    # a sampled schema has no required fields, but what is not a JSON object is still rejected
    errors = {r["error"] for r in rows(tmp_path / "s" / REJECTS_DIR)}
    assert errors == {"not valid JSON", "not a JSON object: an array", "empty value"}


def test_an_added_optional_field_loads_with_a_declared_schema_file(spark, module_cluster, tmp_path):
    old = [json.dumps({"server": "a", "n": i, "ts_ms": BASE}).encode() for i in range(4)]
    new = [json.dumps({"server": "a", "n": i, "ts_ms": BASE, "region": f"eu-{i}"}).encode() for i in range(4, 8)]
    messages = send_raw(module_cluster.zookeeper, "evolving", old + new)
    schema_file = tmp_path / "event.json"
    schema_file.write_text(json.dumps({
        "type": "object", "required": ["ts_ms"],
        "properties": {"server": {"type": "string"}, "n": {"type": "integer"}, "ts_ms": {"type": "integer"},
                       "region": {"type": "string"}}}))
    result = load(spark, module_cluster.zookeeper, "evolving", tmp_path / "s", value_format="json",
                  schema=str(schema_file))
    assert result["rejected_count"] == 0 and result["row_count"] == len(messages)
    regions = {r["n"]: r["region"] for r in rows(tmp_path / "s", ["n", "region"])}
    assert regions == {**{i: None for i in range(4)}, **{i: f"eu-{i}" for i in range(4, 8)}}


TYPED = ("server string NOT NULL, n long, ratio double, ok boolean, day date, at timestamp, price decimal(9,2), "
         "tags array<string>, attrs map<string, int>, geo struct<lat: double, lon: double>, small int, value string")


def test_iceberg_layout_writes_one_directory_per_hour_with_iceberg_types(spark, module_cluster, tmp_path):
    values = [json.dumps({"server": f"web-{i}", "n": i, "ratio": i / 3, "ok": i % 2 == 0, "day": "2024-01-01",
                          "at": "2024-01-01T10:00:00Z", "price": 12.5, "tags": ["a"], "attrs": {"k": i},
                          "geo": {"lat": 1.0, "lon": 2.0}, "small": i, "value": "v"}).encode()
              for i in range(9)]
    values.append(b"{broken")
    messages = send_raw(module_cluster.zookeeper, "typed", values, spacing_ms=25 * 60_000)  # over 4 hours
    result = load(spark, module_cluster.zookeeper, "typed", tmp_path / "s", value_format="json", schema=TYPED,
                  layout="iceberg")
    assert result["layout"] == "iceberg" and result["row_count"] == 9 and result["rejected_count"] == 1

    hours = {(BASE + i * 25 * 60_000) // HOUR for i in range(9)}
    assert {p.name for p in (tmp_path / "s").iterdir() if p.is_dir()} == {
        f"logbus_hour={h}" for h in hours} | {REJECTS_DIR}
    declared = load_schema(TYPED).to_arrow()
    expected = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                          ("timestamp", pa.timestamp("us", tz="UTC")), ("key", pa.binary()),
                          ("headers", headers_type()), *declared])
    files = sorted((tmp_path / "s").glob("logbus_hour=*/*.parquet"))
    for path in files:
        schema = pq.read_schema(path)
        assert schema.names == expected.names  # no event_date/event_hour/logbus_hour in the file
        for field in expected:
            assert schema.field(field.name).type == field.type, field.name
        assert not schema.field("server").nullable  # declared NOT NULL: a REQUIRED column
        assert pq.ParquetFile(path).schema.column(3).physical_type == "INT64"  # TIMESTAMP_MICROS, not INT96
    for path in files:
        hour = int(path.parent.name.split("=")[1])
        stamps = pq.read_table(path, columns=["timestamp"])["timestamp"].to_pylist()
        assert {int(t.timestamp() * 1000) // HOUR for t in stamps} == {hour}
    assert set(pq.read_table(files[0], columns=["value"])["value"].to_pylist()) == {"v"}  # a JSON field `value`
    rejects = pq.read_table(next((tmp_path / "s" / REJECTS_DIR).glob("*.parquet")))
    assert rejects.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert rejects.column("value").to_pylist() == [b"{broken"]
    assert sum(len(pq.read_table(p)) for p in files) == len(messages) - 1


def test_an_empty_batch_writes_zero_counts_and_no_rejects(spark, module_cluster, tmp_path):
    result = run_load(spark, [], str(tmp_path / "s"), zookeeper=module_cluster.zookeeper, value_format="json",
                      schema=SCHEMA, layout="iceberg")
    assert (result["row_count"], result["rejected_count"], result["counts"], result["rejected"]) == (0, 0, [], [])
    assert (tmp_path / "s" / COUNTS_FILE).exists() and not (tmp_path / "s" / REJECTS_DIR).exists()
    assert not list((tmp_path / "s").rglob("*.parquet"))


NESTED = ("server string NOT NULL, n long, ratio double, ok boolean, small int, tags array<string>, "
          "geo struct<lat: double, lon: double NOT NULL>, value string")
DOUBTFUL = [  # values where a JSON parser other than Spark's could answer otherwise
    b'{"server": 5, "n": 1}', b'{"server": "a", "n": "5"}', b'{"server": "a", "n": 5.0}',
    b'{"server": "a", "n": 99999999999999999999}', b'{"server": "a", "small": 3000000000}',
    b'{"server": "a", "n": 1, "n": 2}', b'{"server": "\xff\xfe", "n": 3}', b'{"server": "a", "ratio": NaN}',
    b'{"server": "a", "ratio": 1e400}', b'{"server": "a", "ratio": 7}', b'{"server": "a", "ok": "true"}',
    b'{"server": "a", "n": 4} ', b' {"server": "a", "n": 5}', b'{"server": "a", "n": 6}\n',
    b'{\n  "server": "pretty",\n  "n": 7\n}', b'{"server": "a", "n": 8}{"server": "b", "n": 9}',
    b'{"server": "a\\u0000b\\ud83d\\ude00", "n": 10}', b'{"server": "a", "tags": ["x", 1, null]}',
    b'{"server": "a", "tags": "x"}', b'{"server": "a", "geo": {"lat": 1}}', b'{"server": "a", "geo": [1, 2]}',
    b'{"server": "a", "geo": {"lat": 1, "lon": 2, "alt": 3}}', b'{"server": null}', b"{}",
    b'{"server": "a", "n": -0, "unknown": {"deep": [1e999, "x"]}}', b'{"server": "a", "value": {"nested": 1}}',
    b'{"Server": "case", "n": 11}', b'{"server": "a", "n": 01}', b"null", b"7", b'"{}"',
]


@pytest.mark.parametrize("topic,schema", [("doubtful-nested", NESTED), ("doubtful-flat", SCHEMA),
                                          ("doubtful-inferred", None)])
def test_the_readers_json_parse_loads_exactly_what_sparks_from_json_loads(spark, module_cluster, tmp_path, topic,
                                                                          schema):
    """The data source parses values with pyarrow where its answer is Spark's
    (`spark/reader_json.py`); every row accepted or rejected, and why, is what Spark's
    own parse of every value gives — on good values and on every doubtful one."""
    def good(i: int) -> bytes:
        return json.dumps({"server": f"web-{i}", "n": i, "ts_ms": BASE + i, "ratio": i / 3, "ok": True, "small": i,
                           "tags": ["a", "b"], "geo": {"lat": 1.5, "lon": -2.5}}).encode()

    # each doubtful value alone among good ones: further apart in its partition than the
    # spans a refused value is isolated in, so the ones pyarrow takes are taken by it
    values = []
    for doubtful in [*DOUBTFUL, *BAD]:
        values += [good(len(values) + i) for i in range(3 * MIN_SPAN)] + [doubtful]
    messages = send_raw(module_cluster.zookeeper, topic, values, spacing_ms=100)
    source = read_ranges(spark, ranges_of(module_cluster.zookeeper, topic), module_cluster.zookeeper,
                         json_value=json_schema(spark, read_ranges(spark, [], module_cluster.zookeeper),
                                                schema or NESTED))
    assert PARSED_IN_READER in source.columns  # the reader's parse is really under test

    results = {}
    for in_reader in (True, False):
        staging = tmp_path / f"in-reader-{in_reader}"
        result = load(spark, module_cluster.zookeeper, topic, staging, value_format="json", schema=schema,
                      parse_in_reader=in_reader)
        accepted = sorted(rows(staging), key=lambda r: (r["partition"], r["offset"]))
        rejected = sorted(rows(staging / REJECTS_DIR), key=lambda r: (r["partition"], r["offset"]))
        results[in_reader] = (result, accepted, rejected)
    (result, accepted, rejected), (reference, accepted_by_spark, rejected_by_spark) = results[True], results[False]
    assert list(map(repr, accepted)) == list(map(repr, accepted_by_spark))  # repr: NaN == NaN
    assert rejected == rejected_by_spark
    assert result == reference
    assert result["row_count"] + result["rejected_count"] == len(messages)
    if schema is None:  # a key repeated in a value, and `Server` beside `server`: one field per name
        assert [f.name for f in load_schema(result["schema"]).to_arrow()].count("n") == 1
        assert "server" in result["schema"] and "Server" not in result["schema"]
    assert result["row_count"] >= len(values) - len(DOUBTFUL) - len(BAD)
    assert {b"this is not json", b""} <= {r["value"] for r in rejected}


def test_what_the_reader_parses_spark_reads_the_same_on_mutated_and_limit_breaking_json(spark):
    """A differential test of the two parsers: every value the data source's pyarrow
    parse takes (`reader_json.parse_values`, one value at a time) must be read the same
    by Spark's `from_json`, field for field, and not as corrupt — on values at the edges
    of JSON and of Jackson's limits, and on a thousand random mutations of good ones."""
    import random

    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from airflow_provider_logbus.spark.decode import _parse
    from airflow_provider_logbus.spark.reader_json import CORRUPT, arrow_value_type, parse_values

    struct = StructType.fromDDL("n long, d double, s string, b boolean, i int, l array<long>, "
                                "st struct<x: double, y: string>")
    edges = [
        b'{"d": Inf}', b'{"d": -Inf}', b'{"d": Infinity}', b'{"d": -Infinity}', b'{"d": +Infinity}', b'{"d": NaN}',
        b'{"d": -NaN}', b'{"n": 1, "zz": Inf}', b'{"s": "a\x01b"}', b'{"s": "\\ud800"}', b'{"\\u006e": 5}',
        b'{"d": 1e400}', b'{"d": 1e-400}', b'{"i": 2147483648}', b'{"n": -9223372036854775808}', b'{"n": 1e0}',
        b'{"s": "\xed\xa0\x80"}', b'{"l": [1, 2.0]}', b'{"st": {"x": 1, "x": 2}}', b'{"n"\t:\r\n1}',
        b'{"d": 4.9e-324}', b"{'n': 1}", b'{n: 1}', b'{"n": 1 /* c */}',
        b'{"n": 1, "x": ' + b"[" * 999 + b"]" * 999 + b"}", b'{"n": 1, "x": ' + b"[" * 1000 + b"]" * 1000 + b"}",
        b'{"d": 1' + b"0" * 1000 + b"}", b'{"n": 1, "x": 1' + b"0" * 999 + b"}",
        b'{"n": 1, "' + b"k" * 50_000 + b'": 1}', b'{"n": 1, "s": "' + b"x" * 20_000_001 + b'"}',
        b'{"n": 1, "s": "' + b"x" * 3000 + b'"}',
    ]
    rng = random.Random(25)
    alphabet = b'{}[]":,0123456789.eE+-nultrfasNI\\ \t'
    mutated = []
    for _ in range(200):
        good = bytearray(json.dumps({"n": rng.randint(-10**6, 10**6), "d": rng.random() * 10 ** rng.randint(-5, 5),
                                     "s": "x\u00e9\u4e2d", "b": True, "i": 3, "l": [1, 2],
                                     "st": {"x": 1.5, "y": "q"}}).encode())
        mutated.append(bytes(good))
        for _ in range(5):
            w = bytearray(good)
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(len(w))
                choice = rng.random()
                if choice < 0.4:
                    w[at] = rng.choice(alphabet)
                elif choice < 0.7:
                    del w[at]
                else:
                    w.insert(at, rng.choice(alphabet))
            mutated.append(bytes(w))
    values = edges + mutated
    value_type = arrow_value_type(struct.json())
    by_pyarrow = [parse_values(pa.array([v], pa.binary()), value_type, [], False)[0].to_pylist()[0] for v in values]
    frame = spark.createDataFrame([(v,) for v in values], "v binary")
    by_spark = [r.p.asDict(recursive=True) if r.p is not None else None
                for r in frame.select(_parse(F.col("v").cast("string"), struct).alias("p")).collect()]

    taken = [(v, mine, theirs) for v, mine, theirs in zip(values, by_pyarrow, by_spark) if mine is not None]
    assert len(taken) > 150  # pyarrow's parse is really under test
    for value, mine, theirs in taken:
        assert theirs is not None and theirs[CORRUPT] is None, value[:200]
        assert json.dumps(mine, sort_keys=True) == json.dumps(theirs, sort_keys=True), value[:200]
