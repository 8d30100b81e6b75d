"""The Spark load (local mode, real brokers, a real `logbus schema-registry`) of values
framed by confluent_kafka's AvroSerializer (`--format confluent`): records of two
versions of a subject load into the table's columns, and values that cannot decode land
in the rejects with their reason, counted."""

from __future__ import annotations

import json
import struct

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from airflow_provider_logbus.spark.load_job import COUNTS_FILE, REJECTS_DIR, arguments, run_load
from harness.registry import RegistryProcess
from tests.provider.test_schema_and_rejects import ranges_of, rows, send_raw
from tests.registry import schemas as s

pytestmark = pytest.mark.slow

TABLE = "a int NOT NULL, b string"


@pytest.fixture
def registry(module_cluster, tmp_path):
    started = RegistryProcess(module_cluster.zookeeper, tmp_path, "registry-0").start()
    yield started
    started.stop()


def test_framed_avro_values_load_into_columns_and_bad_ones_into_rejects(spark, module_cluster, registry, tmp_path):
    client = SchemaRegistryClient({"url": registry.url})
    context = SerializationContext("avro-clicks", MessageField.VALUE)
    old = [AvroSerializer(client, s.V1)({"a": i}, context) for i in range(3)]
    new = [AvroSerializer(client, s.ADD_OPTIONAL)({"a": 10 + i, "b": f"x{i}"}, context) for i in range(3)]
    bad = {  # value -> the reject's reason
        old[0][:1] + struct.pack(">I", 999) + old[0][5:]: "schema id 999 is not in the registry",
        b'{"a": 1}': "not registry-framed: the first byte is 123, not 0",
        new[0][:-3]: "does not decode with schema id",
    }
    zookeeper = module_cluster.zookeeper
    messages = send_raw(zookeeper, "avro-clicks", [*old, *bad, *new])

    result = run_load(spark, ranges_of(zookeeper, "avro-clicks"), str(tmp_path / "s"), zookeeper=zookeeper,
                      value_format="confluent", schema=TABLE, registry_url=registry.url)

    data = rows(tmp_path / "s", ["partition", "offset", "a", "b"])
    assert sorted((r["a"], r["b"]) for r in data) == [(0, None), (1, None), (2, None),
                                                       (10, "x0"), (11, "x1"), (12, "x2")]
    rejects = rows(tmp_path / "s" / REJECTS_DIR)
    assert {(r["partition"], r["offset"]): r["value"] for r in rejects} == {
        k: v for k, v in messages.items() if v in bad}
    for r in rejects:
        assert bad[r["value"]] in r["error"], r
    assert (result["row_count"], result["rejected_count"], result["format"]) == (6, 3, "confluent")
    assert (tmp_path / "s" / COUNTS_FILE).exists()


def test_the_confluent_format_needs_a_declared_schema_and_a_registry(spark, tmp_path):
    with pytest.raises(ValueError, match="needs the table's schema declared and the registry's URL"):
        run_load(spark, [], str(tmp_path / "s"), value_format="confluent", schema=TABLE)
    parsed = arguments().parse_args(["--ranges", "[]", "--staging", "x", "--format", "confluent",
                                     "--registry-url", "http://r:8081"])
    assert (parsed.format, parsed.registry_url) == ("confluent", "http://r:8081")


def test_the_operator_passes_the_confluent_format_and_the_registry_url(tmp_path, monkeypatch):
    from airflow_provider_logbus.operators.spark_load import LogbusSparkLoadOperator

    monkeypatch.setenv("AIRFLOW_CONN_LOGBUS_DEFAULT",
                       json.dumps({"conn_type": "logbus", "extra": {"zookeeper": "127.0.0.1:2181/x"}}))
    operator = LogbusSparkLoadOperator(task_id="load", table="t", warehouse=str(tmp_path), schema=TABLE,
                                       value_format="confluent", registry_url="http://registry:8081")
    options = dict(zip(*[iter(operator.application_args([], tmp_path / "staging", "iceberg"))] * 2))
    assert (options["--format"], options["--registry-url"]) == ("confluent", "http://registry:8081")
    assert "registry_url" in LogbusSparkLoadOperator.template_fields
