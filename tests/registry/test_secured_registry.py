"""A registry secured like the cluster (docs/schemas.md, "Security"): HTTPS, HTTP Basic
checked against the cluster's SCRAM users in ZooKeeper (stored under ZooKeeper ACLs,
read with the cluster's identity), and ACLs on subjects granted with `logbus acls`.
Refusals store nothing."""

from __future__ import annotations

import os
import ssl
import struct
import uuid

import httpx
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from broker.tools.cli import main as logbus
from harness.registry import RegistryProcess
from harness.secured import ZOOKEEPER_AUTH, SecuredCluster
from tests.registry import schemas as s

VALUE = SerializationContext("clicks", MessageField.VALUE)


@pytest.fixture
def secured(zookeeper, tmp_path):
    cluster = SecuredCluster(tmp_path / "secured", zookeeper, chroot=f"/registry-{uuid.uuid4().hex[:12]}")
    cluster.add_user("alice", "alice-secret")
    cluster.add_user("bob", "bob-secret")
    yield cluster
    cluster.stop()


@pytest.fixture
def registry(secured, start_registry) -> RegistryProcess:
    issued = secured.ca.issue("127.0.0.1")
    return start_registry(zookeeper=secured.connect_string, tls=(str(issued.certfile), str(issued.keyfile)),
                          basic_auth=True, super_users=("User:admin",), zookeeper_auth=ZOOKEEPER_AUTH)


def http(registry, secured, user: str | None = None, password: str | None = None) -> httpx.Client:
    auth = (user, password or f"{user}-secret") if user else None
    return httpx.Client(base_url=registry.url, verify=ssl.create_default_context(cafile=str(secured.ca.cafile)), auth=auth, timeout=30)


def acls(secured, tmp_path, *words: str) -> None:
    config = tmp_path / "admin.properties"
    with open(os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
        file.write(f"zookeeper.auth={ZOOKEEPER_AUTH}\nzookeeper.set.acl=true\n")
    assert logbus(["--zookeeper", secured.connect_string, "--command-config", str(config), "acls", *words]) == 0


def test_writes_without_valid_credentials_are_refused_401_alike_and_nothing_is_stored(registry, secured):
    answers = []
    for user, password in ((None, None), ("alice", "wrong"), ("nobody", "nobody-secret")):
        with http(registry, secured, user, password) as client:
            answer = client.post("/subjects/clicks-value/versions", json={"schema": s.V1})
        assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Basic")
        answers.append(answer.json())
    assert answers[0]["error_code"] == 401 and answers[0] == answers[1] == answers[2]  # an unknown user looks alike
    with http(registry, secured, "admin") as admin:
        assert admin.get("/subjects", params={"deleted": "true"}).json() == []
        assert admin.get("/schemas/ids/1").json()["error_code"] == 40403


def test_a_user_without_the_subject_acl_is_refused_403_and_with_it_serializes(registry, secured, tmp_path):
    with http(registry, secured, "bob") as bob:
        refused = bob.post("/subjects/clicks-value/versions", json={"schema": s.V1})
        assert (refused.status_code, refused.json()["error_code"]) == (403, 40301)
        assert "User:bob" in refused.json()["message"]
    acls(secured, tmp_path, "--add", "--subject", "clicks-value", "--allow-principal", "User:alice",
         "--operation", "Write", "--operation", "Read")

    alice = SchemaRegistryClient({"url": registry.url, "ssl.ca.location": str(secured.ca.cafile),
                                  "basic.auth.user.info": "alice:alice-secret"})
    framed = AvroSerializer(alice, s.V1)({"a": 5}, VALUE)
    schema_id = struct.unpack(">I", framed[1:5])[0]
    assert AvroDeserializer(alice)(framed, VALUE) == {"a": 5}
    with pytest.raises(SchemaRegistryError) as elsewhere:
        alice.register_schema("other-value", alice.get_schema(schema_id))
    assert elsewhere.value.http_status_code == 403
    with http(registry, secured, "bob") as bob:
        assert bob.get(f"/schemas/ids/{schema_id}").status_code == 403  # no Read on a subject using it
        assert bob.get("/subjects").json() == []  # only the subjects one may see
        assert bob.put("/config", json={"compatibility": "NONE"}).status_code == 403
    with http(registry, secured, "alice") as client:
        assert client.get("/subjects").json() == ["clicks-value"]
        assert client.get("/subjects/clicks-value/versions").json() == [1]


def test_the_registry_speaks_only_https_and_basic_auth_needs_it(registry, secured, tmp_path):
    with pytest.raises(httpx.HTTPError):
        httpx.get(registry.url.replace("https://", "http://") + "/subjects", timeout=10)
    plain = RegistryProcess(secured.connect_string, tmp_path, "plain", basic_auth=True)
    with pytest.raises(Exception, match="needs HTTPS"):
        plain.start(timeout=30)
