"""Bad requests to the registry, each answered with its documented error in
Confluent's shape (docs/schemas.md, "Errors") and nothing stored; deletes in
Confluent's order (soft before hard). Raw HTTP, so the exact statuses and bodies show."""

from __future__ import annotations

import json

import httpx
import pytest
from kazoo.client import KazooClient

from broker.registry.access import Access
from broker.registry.api import Api
from broker.registry.store import SchemaStore
from broker.registry.subjects import Subjects
from tests.registry import schemas as s

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


@pytest.fixture
def http(registry):
    with httpx.Client(base_url=registry.url, timeout=30) as client:
        yield client


def error(response: httpx.Response) -> tuple[int, int]:
    body = response.json()
    assert set(body) == {"error_code", "message"} and body["message"]
    assert response.headers["content-type"] == CONTENT_TYPE
    return response.status_code, body["error_code"]


def nothing_stored(http: httpx.Client) -> None:
    assert http.get("/subjects", params={"deleted": "true"}).json() == []
    assert error(http.get("/schemas/ids/1")) == (404, 40403)


@pytest.mark.parametrize("body, expected", [
    (b"{not json", (400, 400)),
    (b"[1, 2]", (400, 400)),
    (b"\xff\xfe", (400, 400)),
    (json.dumps({"schema": "{\"type\": \"record\"}"}).encode(), (422, 42201)),  # a record without name or fields
    (json.dumps({"schema": "not json at all"}).encode(), (422, 42201)),
    (json.dumps({"schema": "{\"type\": \"recrod\", \"name\": \"A\", \"fields\": []}"}).encode(), (422, 42201)),
    (json.dumps({"schema": 12}).encode(), (422, 42201)),
    (json.dumps({}).encode(), (422, 42201)),
    (json.dumps({"schema": s.V1, "schemaType": "PROTOBUF"}).encode(), (422, 42201)),
    (json.dumps({"schema": "{\"type\": 12}", "schemaType": "JSON"}).encode(), (422, 42201)),
    (json.dumps({"schema": "[1]", "schemaType": "JSON"}).encode(), (422, 42201)),
    (json.dumps({"schema": s.V1, "references": [{"name": "x", "subject": "y", "version": 1}]}).encode(), (422, 42201)),
])
def test_a_malformed_body_or_schema_is_refused_and_nothing_is_stored(http, body, expected):
    assert error(http.post("/subjects/clicks/versions", content=body)) == expected
    nothing_stored(http)


def test_an_oversized_body_is_refused_with_413_unread_and_nothing_stored(start_registry):
    registry = start_registry(max_body_bytes=10_000)
    # 2 MB: more than socket buffers hold, so the client is still writing when the 413 is sent
    padded = json.dumps({"schema": json.dumps({**json.loads(s.V1), "doc": "x" * 2_000_000})})
    with httpx.Client(base_url=registry.url) as http:
        refused = http.post("/subjects/clicks/versions", content=padded)
        assert error(refused) == (413, 413)
        assert refused.headers["connection"] == "close"  # the body's rest is unread: the client must not reuse it
        nothing_stored(http)
        assert http.post("/subjects/clicks/versions", json={"schema": s.V1}).json() == {"id": 1}  # still serving


def test_unknown_subjects_versions_and_ids_have_their_own_codes(http):
    assert error(http.get("/subjects/nobody/versions")) == (404, 40401)
    assert error(http.get("/subjects/nobody/versions/latest")) == (404, 40401)
    assert error(http.post("/subjects/nobody", json={"schema": s.V1})) == (404, 40401)
    assert http.post("/subjects/clicks/versions", json={"schema": s.V1}).status_code == 200
    assert error(http.get("/subjects/clicks/versions/2")) == (404, 40402)
    assert error(http.get("/subjects/clicks/versions/abc")) == (422, 42202)
    assert error(http.get("/subjects/clicks/versions/0")) == (422, 42202)
    assert error(http.post("/subjects/clicks", json={"schema": s.ADD_OPTIONAL})) == (404, 40403)
    assert error(http.get("/schemas/ids/99")) == (404, 40403)
    assert error(http.get("/schemas/ids/x")) == (404, 40403)
    assert error(http.get("/nowhere")) == (404, 404)
    assert error(http.post("/subjects//versions", json={"schema": s.V1})) == (422, 42208)
    assert error(http.post(f"/subjects/{'x' * 256}/versions", json={"schema": s.V1})) == (422, 42208)
    assert error(http.post("/subjects/a%0Ab/versions", json={"schema": s.V1})) == (422, 42208)
    assert error(http.put("/config", json={"compatibility": "SIDEWAYS"})) == (422, 42203)
    assert error(http.get("/config/clicks")) == (404, 40408)
    assert http.get("/config/clicks", params={"defaultToGlobal": "true"}).json() == {"compatibilityLevel": "BACKWARD"}
    assert http.get("/config").json() == {"compatibilityLevel": "BACKWARD"}  # the bad level was not stored
    assert http.get("/subjects").json() == ["clicks"]


def test_an_incompatible_schema_is_refused_with_409_and_the_reasons(http):
    assert http.post("/subjects/clicks/versions", json={"schema": s.V1}).json() == {"id": 1}
    refused = http.post("/subjects/clicks/versions", json={"schema": s.ADD_REQUIRED})
    assert error(refused) == (409, 409) and "version 1" in refused.json()["message"]
    verbose = http.post("/compatibility/subjects/clicks/versions/latest", params={"verbose": "true"},
                        json={"schema": s.ADD_REQUIRED}).json()
    assert verbose["is_compatible"] is False and any("b" in m for m in verbose["messages"])
    assert http.get("/subjects/clicks/versions").json() == [1]


def test_deletes_go_soft_then_hard_and_ids_stay_readable(http):
    assert http.post("/subjects/clicks/versions", json={"schema": s.V1}).json() == {"id": 1}
    assert http.post("/subjects/clicks/versions", json={"schema": s.ADD_OPTIONAL}).json() == {"id": 2}
    assert error(http.delete("/subjects/clicks", params={"permanent": "true"})) == (404, 40405)
    assert error(http.delete("/subjects/clicks/versions/2", params={"permanent": "true"})) == (404, 40407)
    assert http.delete("/subjects/clicks/versions/2").json() == 2
    assert error(http.delete("/subjects/clicks/versions/2")) == (404, 40406)
    assert http.get("/subjects/clicks/versions").json() == [1]
    assert http.get("/subjects/clicks/versions", params={"deleted": "true"}).json() == [1, 2]
    assert http.delete("/subjects/clicks").json() == [1]
    assert error(http.delete("/subjects/clicks")) == (404, 40404)
    assert error(http.get("/subjects/clicks/versions")) == (404, 40401)
    assert http.get("/subjects").json() == [] and http.get("/subjects", params={"deleted": "true"}).json() == ["clicks"]
    assert http.delete("/subjects/clicks", params={"permanent": "true"}).json() == [1, 2]
    assert http.get("/subjects", params={"deleted": "true"}).json() == []
    assert json.loads(http.get("/schemas/ids/2").json()["schema"]) == json.loads(s.ADD_OPTIONAL)  # ids are forever
    assert http.post("/subjects/clicks/versions", json={"schema": s.A_AS_STRING}).json() == {"id": 3}  # a fresh start


def test_the_schema_endpoint_serves_the_schema_itself_and_types_are_listed(http):
    http.post("/subjects/clicks/versions", json={"schema": s.JSON_V1, "schemaType": "JSON"})
    assert http.get("/subjects/clicks/versions/1/schema").json() == json.loads(s.JSON_V1)
    assert http.get("/subjects/clicks/versions/latest").json()["schemaType"] == "JSON"
    assert http.get("/schemas/types").json() == ["AVRO", "JSON"]


def test_a_zookeeper_failure_is_answered_50001_and_the_registry_serves_on(zk_connect):
    """The API over a real ZooKeeper client whose connection is then closed: every
    request answers 50001 naming ZooKeeper, none raises out of the server's thread."""
    zk = KazooClient(zk_connect)
    zk.start(30)
    api = Api(Subjects(SchemaStore(zk)), Access(None))
    assert api.handle("POST", "/subjects/clicks/versions", "", json.dumps({"schema": s.V1}).encode(), None) == \
        (200, {"id": 1})
    zk.stop()
    zk.close()
    for method, path in (("GET", "/subjects"), ("POST", "/subjects/clicks/versions"), ("GET", "/schemas/ids/1")):
        status, body = api.handle(method, path, "", json.dumps({"schema": s.ADD_OPTIONAL}).encode(), None)
        assert (status, body["error_code"]) == (500, 50001) and "ZooKeeper" in body["message"]
