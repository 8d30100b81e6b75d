"""The Spark load (local mode, real brokers, a real `logbus schema-registry`) of values
framed by confluent_kafka's AvroSerializer and JSONSerializer (`--format confluent`):
records of two versions of a subject load into the table's columns, JSON Schema values
beside Avro ones in one topic, a table declared in Avro resolves older records with its
defaults, a secured registry is reached with a CA and Basic credentials, and values
that cannot decode land in the rejects with their reason, counted."""

from __future__ import annotations

import json
import struct
import uuid

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from airflow_provider_logbus.spark.load_job import COUNTS_FILE, REJECTS_DIR, arguments, run_load
from airflow_provider_logbus.registry_access import REGISTRY_ENV, RegistryUnavailable
from harness.registry import RegistryProcess
from harness.secured import ZOOKEEPER_AUTH, SecuredCluster
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


def json_framed(client, schema: str, record: dict, subject_topic: str) -> bytes:
    return JSONSerializer(schema, client)(record, SerializationContext(subject_topic, MessageField.VALUE))


def test_json_schema_values_load_beside_avro_ones_and_invalid_ones_are_rejected(spark, module_cluster, registry,
                                                                                tmp_path):
    client = SchemaRegistryClient({"url": registry.url})
    avro = [AvroSerializer(client, s.V1)({"a": i}, SerializationContext("avro-src", MessageField.VALUE))
            for i in range(2)]
    good = [json_framed(client, s.JSON_ADD_OPTIONAL, {"a": 20 + i, "b": f"j{i}"}, "json-src") for i in range(2)]
    good.append(json_framed(client, s.JSON_V1, {"a": 30}, "json-v1-src"))
    (json_id,) = struct.unpack(">I", good[0][1:5])
    header = good[0][:5]
    bad = {  # values JSONSerializer would have refused to write, framed with its id
        header + b'{"a": "seven"}': f"does not validate against schema id {json_id}: a: 'seven' is not of type "
                                    f"'integer'",
        header + b'{"a": 1, "c": 2}': f"does not validate against schema id {json_id}: Additional properties are "
                                      f"not allowed ('c' was unexpected)",
        header + b'{"a": 1': f"does not decode with schema id {json_id}: not valid JSON",
        header + b'[1]': f"does not validate against schema id {json_id}: [1] is not of type 'object'",
    }
    zookeeper = module_cluster.zookeeper
    messages = send_raw(zookeeper, "mixed-clicks", [*avro, *good, *bad])

    result = run_load(spark, ranges_of(zookeeper, "mixed-clicks"), str(tmp_path / "s"), zookeeper=zookeeper,
                      value_format="confluent", schema=TABLE, registry_url=registry.url)

    data = rows(tmp_path / "s", ["a", "b"])
    assert sorted((r["a"], r["b"]) for r in data) == [(0, None), (1, None), (20, "j0"), (21, "j1"), (30, None)]
    rejects = rows(tmp_path / "s" / REJECTS_DIR)
    assert {(r["partition"], r["offset"]): r["value"] for r in rejects} == {
        k: v for k, v in messages.items() if v in bad}
    for r in rejects:
        assert r["error"].startswith(bad[r["value"]]), r
    assert (result["row_count"], result["rejected_count"]) == (5, 4)


AVRO_TABLE = {"type": "record", "name": "Click", "namespace": "logbus.tests", "fields": [
    {"name": "a", "type": "long"},  # the writers' int, promoted
    {"name": "b", "type": ["null", "string"], "default": None},
    {"name": "c", "type": "string", "default": "x"},  # V1 and ADD_OPTIONAL lack it
]}


def test_a_table_declared_in_avro_reads_older_records_with_its_defaults(spark, module_cluster, registry, tmp_path):
    table = tmp_path / "click.avsc.json"
    table.write_text(json.dumps(AVRO_TABLE))
    client = SchemaRegistryClient({"url": registry.url})
    context = SerializationContext("avro-defaults", MessageField.VALUE)
    client.set_compatibility("avro-defaults-value", "NONE")
    values = [AvroSerializer(client, s.V1)({"a": 1}, context),
              AvroSerializer(client, s.ADD_DEFAULT_C)({"a": 2, "c": "y"}, context),
              AvroSerializer(client, s.ADD_OPTIONAL)({"a": 3, "b": "z"}, context)]
    no_a = AvroSerializer(client, s.REMOVE_A)({"b": "q"}, context)  # a has no default in the table
    zookeeper = module_cluster.zookeeper
    send_raw(zookeeper, "avro-defaults", [*values, no_a])

    result = run_load(spark, ranges_of(zookeeper, "avro-defaults"), str(tmp_path / "s"), zookeeper=zookeeper,
                      value_format="confluent", schema=str(table), registry_url=registry.url)

    data = rows(tmp_path / "s", ["a", "b", "c"])
    assert sorted((r["a"], r["b"], r["c"]) for r in data) == [(1, None, "x"), (2, None, "y"), (3, "z", "x")]
    [reject] = rows(tmp_path / "s" / REJECTS_DIR)
    (no_a_id,) = struct.unpack(">I", no_a[1:5])
    assert reject["error"] == (f"schema id {no_a_id} does not resolve to the table's Avro schema: the writer has no "
                               f"field a, and the table gives it no default")
    assert (result["row_count"], result["rejected_count"]) == (3, 1)


@pytest.fixture
def secured_registry(zookeeper, tmp_path):
    """A registry with HTTPS and Basic auth on users of a secured cluster's ZooKeeper (no
    brokers: the topic is on `module_cluster`); `loader` may read subjects `secure-`."""
    from broker.common.acls import Operation, PatternType, ResourceType

    secured = SecuredCluster(tmp_path / "secured", zookeeper, chroot=f"/registry-{uuid.uuid4().hex[:12]}")
    secured.add_user("loader", "loader-secret")
    secured.allow("User:loader", Operation.READ, ResourceType.SUBJECT, "secure-", PatternType.PREFIXED)
    issued = secured.ca.issue("127.0.0.1")
    started = RegistryProcess(secured.connect_string, tmp_path, "secured-registry",
                              tls=(str(issued.certfile), str(issued.keyfile)), basic_auth=True,
                              super_users=("User:admin",), zookeeper_auth=ZOOKEEPER_AUTH).start()
    yield started, secured
    started.stop()
    secured.stop()


def test_a_secured_registry_is_reached_with_a_ca_and_basic_auth_and_a_wrong_password_fails_the_load(
        spark, module_cluster, secured_registry, tmp_path, monkeypatch):
    registry, secured = secured_registry
    admin = SchemaRegistryClient({"url": registry.url, "ssl.ca.location": str(secured.ca.cafile),
                                  "basic.auth.user.info": "admin:admin-secret"})
    context = SerializationContext("secure-clicks", MessageField.VALUE)
    values = [AvroSerializer(admin, s.ADD_OPTIONAL)({"a": i, "b": f"s{i}"}, context) for i in range(3)]
    zookeeper = module_cluster.zookeeper
    send_raw(zookeeper, "secure-clicks", values)
    ranges = ranges_of(zookeeper, "secure-clicks")

    def load(password: str, staging: str) -> dict:
        # the operator's way: credentials in the job's environment, not its arguments
        monkeypatch.setenv(REGISTRY_ENV, json.dumps({"basic.auth.user.info": f"loader:{password}",
                                                     "ssl.ca.location": str(secured.ca.cafile)}))
        return run_load(spark, ranges, str(tmp_path / staging), zookeeper=zookeeper, value_format="confluent",
                        schema=TABLE, registry_url=registry.url)

    with pytest.raises(RegistryUnavailable) as refused:
        load("wrong", "refused")
    assert str(refused.value) == (f"schema registry {registry.url} refused the load's credentials (HTTP 401, user "
                                  f"'loader'): check the schema registry connection's login and password")
    assert not (tmp_path / "refused" / COUNTS_FILE).exists()
    result = load("loader-secret", "loaded")
    assert sorted((r["a"], r["b"]) for r in rows(tmp_path / "loaded", ["a", "b"])) == [
        (0, "s0"), (1, "s1"), (2, "s2")]
    assert (result["row_count"], result["rejected_count"]) == (3, 0)


def test_the_operator_passes_the_registry_connections_secrets_in_the_environment_not_the_arguments(
        tmp_path, monkeypatch):
    from airflow_provider_logbus.operators.spark_load import LogbusSparkLoadOperator
    from airflow_provider_logbus.storage import Storage

    monkeypatch.setenv("AIRFLOW_CONN_LOGBUS_DEFAULT",
                       json.dumps({"conn_type": "logbus", "extra": {"zookeeper": "127.0.0.1:2181/x"}}))
    monkeypatch.setenv("AIRFLOW_CONN_REGISTRY", json.dumps({
        "conn_type": "logbus_schema_registry", "host": "registry.example", "port": 8081, "login": "loader",
        "password": "pa55-word", "extra": {"ssl_cafile": "/etc/logbus/ca.pem"}}))
    table = tmp_path / "click.json"
    table.write_text(json.dumps(AVRO_TABLE))
    operator = LogbusSparkLoadOperator(task_id="load", table="t", warehouse=str(tmp_path), schema=str(table),
                                       value_format="confluent", registry_conn_id="registry")
    args = operator.application_args([], tmp_path / "staging", "iceberg")
    options = dict(zip(*[iter(args)] * 2))
    assert options["--registry-url"] == "https://registry.example:8081"
    assert json.loads(options["--avro-schema"]) == AVRO_TABLE  # the reader schema, beside its DDL
    assert options["--schema"] == "`a` bigint NOT NULL, `b` string, `c` string NOT NULL"
    assert not any("pa55-word" in arg for arg in args)
    env = operator.job_environment(Storage())
    assert json.loads(env[REGISTRY_ENV]) == {"basic.auth.user.info": "loader:pa55-word",
                                             "ssl.ca.location": "/etc/logbus/ca.pem"}


@pytest.mark.long
def test_the_operators_job_reaches_the_secured_registry_through_its_connection(module_cluster, secured_registry,
                                                                               tmp_path, monkeypatch):
    """spark-submit as the task runs it: the connection's credentials reach the job (a
    refusal naming the connection's user), never its log; the right ones load."""
    from airflow_provider_logbus.operators.spark_load import LogbusLoadError, LogbusSparkLoadOperator
    from airflow_provider_logbus.plan import BatchPlan
    from airflow_provider_logbus.spark.failure import SPARK_LOG
    from airflow_provider_logbus.storage import Storage

    registry, secured = secured_registry
    admin = SchemaRegistryClient({"url": registry.url, "ssl.ca.location": str(secured.ca.cafile),
                                  "basic.auth.user.info": "admin:admin-secret"})
    context = SerializationContext("secure-op", MessageField.VALUE)
    zookeeper = module_cluster.zookeeper
    send_raw(zookeeper, "secure-op", [AvroSerializer(admin, s.V1)({"a": i}, context) for i in range(2)])
    plan = BatchPlan("b1", "t", "secure-op", "i0", "i1", tuple(ranges_of(zookeeper, "secure-op")))
    monkeypatch.setenv("AIRFLOW_CONN_LOGBUS_DEFAULT",
                       json.dumps({"conn_type": "logbus", "extra": {"zookeeper": zookeeper}}))

    def run(password: str, staging: str) -> None:
        monkeypatch.setenv("AIRFLOW_CONN_REGISTRY", json.dumps({
            "conn_type": "logbus_schema_registry", "host": registry.url, "login": "loader", "password": password,
            "extra": {"ssl_cafile": str(secured.ca.cafile)}}))
        operator = LogbusSparkLoadOperator(task_id="load", table="t", warehouse=str(tmp_path), schema=TABLE,
                                           value_format="confluent", registry_conn_id="registry")
        operator.run_spark(plan, str(tmp_path / staging), "directory", Storage())

    with pytest.raises(LogbusLoadError) as failed:
        run("wrong-pa55-word", "refused")
    assert str(failed.value).startswith(f"RegistryUnavailable: schema registry {registry.url} refused the load's "
                                        f"credentials (HTTP 401, user 'loader')")
    assert "wrong-pa55-word" not in (tmp_path / "refused" / SPARK_LOG).read_text()
    run("loader-secret", "loaded")
    assert sorted(r["a"] for r in rows(tmp_path / "loaded", ["a"])) == [0, 1]
