"""How a load reaches a secured registry (`spark/registry_schemas.py`): each way of
failing to — no credentials, a wrong password, no CA, nobody listening — is a
`RegistryUnavailable` saying what to fix (the load fails: not the data's fault), and
the right credentials read a schema by id."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from airflow_provider_logbus.spark.registry_schemas import RegistryAccess, RegistryUnavailable, writer_schema
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
