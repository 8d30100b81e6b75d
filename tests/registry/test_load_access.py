"""How a load reaches a secured registry (`spark/registry_schemas.py`): each way of
failing to — no credentials, a wrong password, no CA, nobody listening — is a
`RegistryUnavailable` saying what to fix (the load fails: not the data's fault), and
the right credentials read a schema by id."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from airflow_provider_logbus.registry_access import RegistryAccess, RegistryUnavailable
from airflow_provider_logbus.spark.registry_schemas import writer_schema
from harness.process import free_port
from tests.registry import schemas as s
from tests.registry.test_secured_registry import registry, secured  # noqa: F401 (fixtures)


def refusal(access: RegistryAccess) -> str:
    with pytest.raises(RegistryUnavailable) as refused:
        access.check()
    return str(refused.value)


def test_each_way_of_not_reaching_the_registry_says_what_to_fix(registry, secured):  # noqa: F811
    ca = str(secured.ca.cafile)
    assert refusal(RegistryAccess(registry.url, cafile=ca)) == (
        f"schema registry {registry.url} asks for credentials (HTTP 401) and the load has none: give the schema "
        f"registry connection a login and password")
    assert refusal(RegistryAccess(registry.url, "bob", "wrong", ca)) == (
        f"schema registry {registry.url} refused the load's credentials (HTTP 401, user 'bob'): check the schema "
        f"registry connection's login and password")
    assert refusal(RegistryAccess(registry.url, "bob", "bob-secret")).startswith(
        f"schema registry {registry.url}: TLS failed ([SSL: CERTIFICATE_VERIFY_FAILED]")
    nobody = f"https://127.0.0.1:{free_port()}"
    assert refusal(RegistryAccess(nobody, "bob", "bob-secret", ca)).startswith(
        f"schema registry {nobody} is unreachable: ")


def test_the_right_credentials_read_a_schema_by_id_past_a_dead_registry(registry, secured):  # noqa: F811
    admin = SchemaRegistryClient({"url": registry.url, "ssl.ca.location": str(secured.ca.cafile),
                                  "basic.auth.user.info": "admin:admin-secret"})
    value = AvroSerializer(admin, s.V1)({"a": 1}, SerializationContext("clicks", MessageField.VALUE))
    (schema_id,) = struct.unpack(">I", value[1:5])
    access = RegistryAccess.from_properties(f"https://127.0.0.1:{free_port()},{registry.url}", {
        "basic.auth.user.info": "admin:admin-secret", "ssl.ca.location": str(secured.ca.cafile)})
    assert writer_schema(access, schema_id).kind == "AVRO"


def test_the_schema_check_reads_a_secured_registry_through_its_connection(registry, secured, tmp_path,  # noqa: F811
                                                                          monkeypatch):
    """`schema_subject`'s lookup and `LogbusSchemaCheckOperator` reach the registry as the
    load does (docs/schemas.md, "Loads"): through a `logbus_schema_registry` connection's
    CA and credentials; a wrong password fails the task as the registry's refusal, not as
    an incompatible schema."""
    import json

    from airflow_provider_logbus.operators.schema_check import LogbusSchemaCheckOperator

    admin = SchemaRegistryClient({"url": registry.url, "ssl.ca.location": str(secured.ca.cafile),
                                  "basic.auth.user.info": "admin:admin-secret"})
    admin.register_schema("checked-value", Schema(s.V1, "AVRO"))

    def check(password: str) -> dict:
        monkeypatch.setenv("AIRFLOW_CONN_CHECKED_REGISTRY", json.dumps({
            "conn_type": "logbus_schema_registry", "host": registry.url, "login": "admin", "password": password,
            "extra": {"ssl_cafile": str(secured.ca.cafile)}}))
        return LogbusSchemaCheckOperator(task_id="check_schema", table="new_table", schema_subject="checked-value",
                                         registry_conn_id="checked_registry", warehouse=str(tmp_path)).execute({})

    assert check("admin-secret")["version"] == 1  # read with the connection's CA and credentials
    with pytest.raises(RegistryUnavailable, match="refused the load's credentials .HTTP 401, user 'admin'"):
        check("wrong")
