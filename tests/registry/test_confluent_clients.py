"""The registry as Kafka clients see it: confluent_kafka's SchemaRegistryClient and its
Avro and JSON serializers against `logbus schema-registry` processes on a real
ZooKeeper — register, evolve, be refused by each compatibility level, look up by id —
and the same answers from a second process after the first is killed."""

from __future__ import annotations

import json
import struct
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.registry import schemas as s

VALUE = SerializationContext("clicks", MessageField.VALUE)


def client(registry) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry.url})


def avro(text: str) -> Schema:
    return Schema(text, "AVRO")


def canonical(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def test_avro_serializer_registers_and_the_deserializer_finds_the_schema_by_id(registry):
    framed = AvroSerializer(client(registry), s.V1)({"a": 7}, VALUE)
    magic, schema_id = struct.unpack(">bI", framed[:5])
    assert magic == 0 and schema_id >= 1
    reader = client(registry)  # a fresh client: nothing cached, the id is asked of the registry
    assert AvroDeserializer(reader)(framed, VALUE) == {"a": 7}
    assert canonical(reader.get_schema(schema_id).schema_str) == canonical(s.V1)
    latest = reader.get_latest_version("clicks-value")
    assert (latest.version, latest.schema_id) == (1, schema_id)


def test_a_compatible_evolution_gets_a_new_version_and_old_data_reads_with_it(registry):
    sr = client(registry)
    old = AvroSerializer(sr, s.V1)({"a": 1}, VALUE)
    new = AvroSerializer(sr, s.ADD_OPTIONAL)({"a": 2, "b": "x"}, VALUE)
    assert struct.unpack(">I", old[1:5]) != struct.unpack(">I", new[1:5])
    assert sr.get_versions("clicks-value") == [1, 2]
    reader = AvroDeserializer(client(registry), s.ADD_OPTIONAL)  # the new schema reads both
    assert reader(old, VALUE) == {"a": 1, "b": None} and reader(new, VALUE) == {"a": 2, "b": "x"}


LEVELS = {  # level -> (registered first, accepted next, refused next); a transitive level's refusal is
    # compatible with the latest version and not with an older one
    "BACKWARD": ([s.V1], s.REMOVE_A, s.ADD_REQUIRED),
    "FORWARD": ([s.V1], s.ADD_REQUIRED, s.REMOVE_A),
    "FULL": ([s.V1], s.ADD_OPTIONAL, s.ADD_REQUIRED),
    "FULL_TRANSITIVE": ([s.V1, s.A_DEFAULT], s.ADD_OPTIONAL, s.REMOVE_A),
    "BACKWARD_TRANSITIVE": ([s.V1, s.ADD_DEFAULT_C], s.ADD_DEFAULT_C.replace('"x"', '"y"'), s.REQUIRE_C),
    "FORWARD_TRANSITIVE": ([s.V1, s.A_DEFAULT], s.ADD_REQUIRED.replace('"b"', '"d"'), s.REMOVE_A),
}


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_each_compatibility_level_accepts_what_it_allows_and_refuses_the_rest(registry, level):
    sr = client(registry)
    subject = f"level-{level.lower()}"
    assert sr.set_compatibility(subject, level) == {"compatibility": level}
    first, accepted, refused = LEVELS[level]
    ids = [sr.register_schema(subject, avro(text)) for text in first]
    assert sr.test_compatibility_all_versions(subject, avro(refused)) is False
    assert sr.test_compatibility(subject, avro(refused)) is level.endswith("TRANSITIVE")  # against the latest alone
    with pytest.raises(SchemaRegistryError) as refusal:
        sr.register_schema(subject, avro(refused))
    assert (refusal.value.http_status_code, refusal.value.error_code) == (409, 409)
    assert sr.get_versions(subject) == list(range(1, len(first) + 1))  # nothing stored
    ids.append(sr.register_schema(subject, avro(accepted)))
    assert sr.get_versions(subject) == list(range(1, len(first) + 2)) and len(set(ids)) == len(ids)
    assert sr.get_compatibility(subject) == level


def test_backward_transitive_refuses_what_backward_alone_accepts(registry):
    """REQUIRE_C reads ADD_DEFAULT_C's data (c is there) but not V1's (no c, no default):
    only the transitive level looks back to version 1."""
    sr = client(registry)
    for subject, level in (("plain", "BACKWARD"), ("transitive", "BACKWARD_TRANSITIVE")):
        sr.set_compatibility(subject, level)
        sr.register_schema(subject, avro(s.V1))
        sr.register_schema(subject, avro(s.ADD_DEFAULT_C))
    assert sr.register_schema("plain", avro(s.REQUIRE_C)) >= 1
    with pytest.raises(SchemaRegistryError) as refusal:
        sr.register_schema("transitive", avro(s.REQUIRE_C))
    assert refusal.value.error_code == 409 and "version 1" in str(refusal.value)


def test_none_accepts_any_change_and_the_global_level_holds_for_subjects_without_their_own(registry):
    sr = client(registry)
    assert sr.get_compatibility() == "BACKWARD"
    sr.register_schema("free", avro(s.V1))
    with pytest.raises(SchemaRegistryError):
        sr.register_schema("free", avro(s.A_AS_STRING))
    assert sr.set_compatibility(level="NONE") == {"compatibility": "NONE"}
    assert sr.register_schema("free", avro(s.A_AS_STRING)) >= 1
    assert sr.get_versions("free") == [1, 2]


def test_one_schema_has_one_id_across_subjects_and_spacing(registry):
    sr = client(registry)
    first = sr.register_schema("one", avro(s.V1))
    respaced = json.dumps(json.loads(s.V1), indent=4)
    assert sr.register_schema("two", avro(respaced)) == first
    assert client(registry).register_schema("one", avro(s.V1)) == first  # again: no new version
    assert sr.get_versions("one") == [1]
    found = sr.lookup_schema("two", avro(respaced))
    assert (found.schema_id, found.version, found.subject) == (first, 1, "two")
    assert sorted((v.subject, v.version) for v in sr.get_schema_versions(first)) == [("one", 1), ("two", 1)]


def test_json_serializer_registers_evolves_and_is_refused_a_new_required_property(registry):
    sr = client(registry)
    framed = JSONSerializer(s.JSON_V1, sr)({"a": 1}, VALUE)
    assert JSONDeserializer(None, schema_registry_client=client(registry))(framed, VALUE) == {"a": 1}
    evolved = JSONSerializer(s.JSON_ADD_OPTIONAL, sr)({"a": 2, "b": "x"}, VALUE)
    assert struct.unpack(">I", evolved[1:5]) != struct.unpack(">I", framed[1:5])
    with pytest.raises(SchemaRegistryError) as refusal:
        sr.register_schema("clicks-value", Schema(s.JSON_ADD_REQUIRED, "JSON"))
    assert refusal.value.error_code == 409 and "/b: required by the reader" in str(refusal.value)
    latest = sr.get_latest_version("clicks-value")
    assert latest.version == 2 and latest.schema.schema_type == "JSON"


def test_a_second_registry_answers_the_same_after_the_first_is_killed(start_registry):
    first, second = start_registry("registry-a"), start_registry("registry-b")
    sr = client(first)
    v1 = sr.register_schema("clicks-value", avro(s.V1))
    v2 = sr.register_schema("clicks-value", avro(s.ADD_OPTIONAL))
    sr.set_compatibility("clicks-value", "FULL")
    framed = AvroSerializer(sr, s.ADD_OPTIONAL)({"a": 3, "b": None}, VALUE)
    first.kill()

    # a fresh cache; a refused connection fails over to the next url at once (no retries of the dead one)
    other = SchemaRegistryClient({"url": f"{first.url},{second.url}", "max.retries": 0})
    assert AvroDeserializer(other)(framed, VALUE) == {"a": 3, "b": None}
    assert canonical(other.get_schema(v1).schema_str) == canonical(s.V1)
    assert other.get_versions("clicks-value") == [1, 2]
    assert other.get_latest_version("clicks-value").schema_id == v2
    assert other.get_compatibility("clicks-value") == "FULL"
    assert other.register_schema("clicks-value", avro(s.V1)) == v1  # known: the same id, no new version
    with pytest.raises(SchemaRegistryError):
        other.register_schema("clicks-value", avro(s.ADD_REQUIRED))  # FULL held over
    v3 = other.register_schema("clicks-value", avro(s.ADD_DEFAULT_C))
    assert v3 > v2 and other.get_versions("clicks-value") == [1, 2, 3]


def test_concurrent_registrations_on_two_registries_give_one_id_per_schema_and_one_schema_per_id(start_registry):
    """Many threads register through both processes at once: the same schema under many
    subjects, and many distinct schemas. ZooKeeper's transactions must leave one id for
    the shared schema and a distinct id, holding its own schema, for each other."""
    registries = [start_registry("registry-a"), start_registry("registry-b")]
    clients = [client(r) for r in registries]
    shared = s.V1
    distinct = [s.record({"name": f"f{i}", "type": "int"}) for i in range(12)]

    def register(i: int) -> tuple[int, int]:
        sr = clients[i % 2]
        return sr.register_schema(f"shared-{i}", avro(shared)), sr.register_schema(f"own-{i}", avro(distinct[i]))

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(register, range(12)))
    assert len({shared_id for shared_id, _ in results}) == 1
    own_ids = [own for _, own in results]
    assert len(set(own_ids)) == 12 and results[0][0] not in own_ids
    reader = client(registries[1])
    for i, own in enumerate(own_ids):
        assert canonical(reader.get_schema(own).schema_str) == canonical(distinct[i])


def test_concurrent_registrations_under_one_subject_each_get_their_own_version(start_registry):
    """Versions are conditional creates: of two registrations that read the same latest
    version, one takes the next number and the other re-reads, checks again and takes
    the one after — no version is overwritten, none lost."""
    registries = [start_registry("registry-a"), start_registry("registry-b")]
    clients = [client(r) for r in registries]
    clients[0].set_compatibility("busy", "NONE")
    distinct = [s.record({"name": f"f{i}", "type": "int"}) for i in range(10)]
    with ThreadPoolExecutor(10) as pool:
        ids = list(pool.map(lambda i: clients[i % 2].register_schema("busy", avro(distinct[i])), range(10)))
    assert clients[1].get_versions("busy") == list(range(1, 11))
    stored = sorted(clients[1].get_version("busy", v).schema_id for v in range(1, 11))
    assert stored == sorted(ids) and len(set(ids)) == 10
