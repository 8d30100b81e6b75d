"""The wire protocol (docs/protocol.md, a contract between the server and every
client): one module per role — `primitives` (API keys, acks, topic names, reads and
writes), `frames` (request and response headers), `requests` (what clients send),
`responses` (what they are answered), `replication` (what brokers send each other) and
`security` (the authentication handshake).
It knows nothing of sockets or logs. Everything public is importable from here."""

from broker.common.protocol.frames import (
    Body, REQUEST_HEADER, RESPONSE_HEADER, RequestHeader, client_id_field, decode_request_header, decode_response_header, encode_request, error_response, raise_for_error, request_head, response_frame, response_header,
)
from broker.common.protocol.primitives import (
    API_VERSION, AUTO_PARTITIONS, Acks, ApiKey, EARLIEST, LATEST, Reader, SIZE, Writer, check_topic_name,
)
from broker.common.protocol.replication import (
    LeaderEpochEndRequest, LeaderEpochEndResponse, REPLICA_FETCH_RESPONSE_HEAD, ReplicaFetchPartition, ReplicaFetchRequest, ReplicaFetchResponse, decode_replica_fetch,
)
from broker.common.protocol.requests import (
    CreateTopicRequest, DeleteTopicRequest, FetchRequest, InitProducerIdRequest, MetadataRequest, MultiFetchRequest, MultiProduceRequest, OffsetsRequest, ProducePart, ProduceRequest, REQUEST_TYPES, RecordCountRequest,
)
from broker.common.protocol.security import (
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
)
from broker.common.protocol.responses import (
    BrokerInfo, FETCH_RESPONSE_HEAD, FETCH_RESPONSE_HEAD_V1, FETCH_VERSION, FetchResponse, METADATA_VERSION, MetadataResponse, PartitionMetadata, PartitionResult, ProduceResponse, ProducerIdResponse, RecordCount, TopicMetadata, decode_multifetch, decode_multiproduce, decode_offsets, encode_offsets, encode_results,
)

__all__ = [
    "API_VERSION",
    "AUTO_PARTITIONS",
    "Acks",
    "ApiKey",
    "Body",
    "BrokerInfo",
    "CreateTopicRequest",
    "DeleteTopicRequest",
    "EARLIEST",
    "FETCH_RESPONSE_HEAD",
    "FETCH_RESPONSE_HEAD_V1",
    "FETCH_VERSION",
    "FetchRequest",
    "FetchResponse",
    "InitProducerIdRequest",
    "LATEST",
    "LeaderEpochEndRequest",
    "LeaderEpochEndResponse",
    "METADATA_VERSION",
    "MetadataRequest",
    "MetadataResponse",
    "MultiFetchRequest",
    "MultiProduceRequest",
    "OffsetsRequest",
    "PartitionMetadata",
    "PartitionResult",
    "ProducePart",
    "ProduceRequest",
    "ProduceResponse",
    "ProducerIdResponse",
    "REPLICA_FETCH_RESPONSE_HEAD",
    "REQUEST_HEADER",
    "REQUEST_TYPES",
    "RESPONSE_HEADER",
    "Reader",
    "RecordCount",
    "RecordCountRequest",
    "ReplicaFetchPartition",
    "ReplicaFetchRequest",
    "ReplicaFetchResponse",
    "RequestHeader",
    "SIZE",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "TopicMetadata",
    "Writer",
    "check_topic_name",
    "decode_multifetch",
    "decode_multiproduce",
    "decode_offsets",
    "decode_replica_fetch",
    "decode_request_header",
    "decode_response_header",
    "encode_offsets",
    "encode_request",
    "client_id_field",
    "request_head",
    "encode_results",
    "error_response",
    "raise_for_error",
    "response_frame",
    "response_header",
]
