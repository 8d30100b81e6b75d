"""Kafka frames and ApiVersions (broker.common.kafka.frames, .apis) against real
clients: librdkafka's requests captured from a socket (it must accept the answers to
get as far as producing), kafka-python's and aiokafka's own encoders and decoders."""

from __future__ import annotations

import pytest
from aiokafka.protocol.admin import ApiVersionRequest_v2 as AiokafkaApiVersions2
from confluent_kafka import Producer
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataRequest

from broker.common.kafka import frames
from broker.common.kafka.apis import SERVED, ApiKey, served
from tests.unit.kafka_capture import CaptureBroker


def test_librdkafka_negotiates_inside_the_served_ranges_and_produces() -> None:
    broker = CaptureBroker()
    try:
        producer = Producer({"bootstrap.servers": broker.address, "enable.idempotence": True, "acks": "all"})
        producer.produce("t", b"value")
        assert producer.flush(30) == 0  # it read every answer: ApiVersions, Metadata, InitProducerId, Produce
        seen = {frames.peek(f)[:2] for f in broker.frames}
    finally:
        broker.close()
    assert {key for key, _ in seen} >= {ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.INIT_PRODUCER_ID, ApiKey.PRODUCE}
    assert all(served(key, version) for key, version in seen), seen
    header = frames.decode_request_header(broker.requests(ApiKey.API_VERSIONS)[0])
    assert header.client_id == "rdkafka" and frames.request_header_version(header.api_key, header.api_version) == 2


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_kafka_python_reads_the_api_versions_answer(version: int) -> None:
    request = ApiVersionsRequest(client_software_name="kafka-python", client_software_version="3", version=version)
    request.with_header(correlation_id=17, client_id="kp")
    header, decoded = frames.decode_request(bytes(request.encode(header=True)))
    assert (header.correlation_id, header.client_id, header.api_version) == (17, "kp", version)
    if version >= 3:
        assert decoded.client_software_name == "kafka-python"
    frame = frames.encode_response(header, frames.api_versions_response(version))
    response = ApiVersionsResponse.decode(frame[4:], version=version, header=True)
    assert response.header.correlation_id == 17 and response.error_code == 0
    assert {k.api_key: (k.min_version, k.max_version) for k in response.api_keys} == SERVED


def test_an_api_versions_request_of_an_unknown_version_gets_the_v0_answer() -> None:
    request = ApiVersionsRequest(client_software_name="kp", client_software_version="3", version=4)
    request.with_header(correlation_id=5, client_id="kp")
    frame = bytes(request.encode(header=True))
    key, version, correlation_id = frames.peek(frame)
    assert not served(key, version)
    response = ApiVersionsResponse.decode(frames.unsupported_api_versions(correlation_id)[4:], version=0, header=True)
    assert response.header.correlation_id == 5 and response.error_code == 35  # UNSUPPORTED_VERSION
    assert {k.api_key: (k.min_version, k.max_version) for k in response.api_keys} == SERVED


def test_aiokafka_api_versions_and_a_flexible_metadata_request_decode() -> None:
    aiokafka = AiokafkaApiVersions2()
    frame = aiokafka.build_request_header(correlation_id=3, client_id="aiokafka").encode() + aiokafka.encode()
    header, _ = frames.decode_request(frame)
    assert (header.api_key, header.api_version, header.client_id) == (ApiKey.API_VERSIONS, 2, "aiokafka")
    metadata = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="t", version=12)],
                               allow_auto_topic_creation=False, version=12)
    metadata.with_header(correlation_id=4, client_id="kp")
    header, decoded = frames.decode_request(bytes(metadata.encode(header=True)))
    assert header.size > 8 and [t.name for t in decoded.topics] == ["t"]


def test_malformed_frames_are_refused_with_a_reason() -> None:
    with pytest.raises(frames.KafkaFrameError, match="shorter than a request header"):
        frames.peek(b"\x00\x12\x00")
    request = ApiVersionsRequest(client_software_name="kp", client_software_version="3", version=3)
    request.with_header(correlation_id=1, client_id="kp")
    frame = bytes(request.encode(header=True))
    with pytest.raises(frames.KafkaFrameError, match="does not decode"):
        frames.decode_request(frame[:-4])
    assert frames.decode_request(frame + b"\0\0")[1].client_software_name == "kp"  # trailing bytes: ignored, as Kafka does
    with pytest.raises(frames.KafkaFrameError, match="client id of length 300"):
        frames.decode_request_header(frame[:8] + b"\x01\x2c" + b"x" * 10)
