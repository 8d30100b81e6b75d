"""The wire codecs (broker/common/protocol.py) without a broker: every request and response
type round-trips, and a few byte layouts are pinned to docs/protocol.md (a contract)."""

import struct

import pytest

from broker.common.errors import ErrorCode, InvalidRequest, OffsetOutOfRange, UnknownTopic
from broker.common.protocol import (
    REQUEST_TYPES, ApiKey, BrokerInfo, CreateTopicRequest, DeleteTopicRequest, FetchRequest, FetchResponse, MetadataRequest,
    MetadataResponse, MultiFetchRequest, MultiProduceRequest, OffsetsRequest, PartitionMetadata, PartitionResult,
    LeaderEpochEndRequest, LeaderEpochEndResponse, ProducePart, ProduceRequest, ProduceResponse, Reader,
    RecordCount, RecordCountRequest, ReplicaFetchPartition, ReplicaFetchRequest, ReplicaFetchResponse, TopicMetadata, decode_multifetch,
    decode_multiproduce, decode_replica_fetch,
    decode_offsets, decode_request_header, decode_response_header, encode_offsets, encode_request, encode_results,
    error_response, raise_for_error, response_frame,
)
from broker.server.log.segment import FileRegion

REQUESTS = [
    ProduceRequest(1, 30_000, "events", 3, b"set-bytes"),
    FetchRequest("events", 0, 1234, 65536, 500, 1),
    MultiFetchRequest([FetchRequest("a", 0, 0, 100), FetchRequest("b", 1, 22, 200, 10, 5)]),
    MultiProduceRequest(-1, 1000, [ProducePart("a", 0, b"x"), ProducePart("b", -1, b"yz")]),
    OffsetsRequest("events", 2, -2, 5),
    MetadataRequest(["a", "b"]),
    MetadataRequest([]),
    CreateTopicRequest("events", -1, 1),
    DeleteTopicRequest("events", 30_000),
    ReplicaFetchRequest(2, 500, True, (ReplicaFetchPartition("events", 1, 5, 4096, 2048, 1 << 20),
                                       ReplicaFetchPartition("clicks", 0, 3, 0, 0, 1024))),
    ReplicaFetchRequest(2, 500, False, ()),
    LeaderEpochEndRequest("events", 1, 4),
    RecordCountRequest("events", 1, 44, -1),
    RecordCountRequest("events", 1, 0, 1 << 40),
]


def plain(value):
    """Decoded message sets are memoryviews over the frame; compare them as bytes."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return (type(value), *(plain(getattr(value, f)) for f in value.__dataclass_fields__))
    return value


def body_bytes(body) -> bytes:
    return b"".join(bytes(part) for part in body)


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_every_request_round_trips_through_its_frame(request_):
    frame = encode_request(request_.API, 7, "client-1", request_.encode())
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    header, reader = decode_request_header(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (request_.API, 0, 7, "client-1")
    assert plain(REQUEST_TYPES[header.api_key].decode(reader)) == plain(request_)


def test_every_api_key_has_its_request_type():
    assert set(REQUEST_TYPES) == set(ApiKey)


def frame_of(correlation_id: int, body) -> Reader:
    """A response as a client reads it: the frame after its size field."""
    frame = body_bytes(response_frame(correlation_id, body))
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    got_id, code, reader = decode_response_header(frame[4:])
    assert (got_id, code) == (correlation_id, 0)
    return reader


def test_produce_response_round_trips():
    reader = frame_of(1, [ProduceResponse(100, 123).encode()])
    assert ProduceResponse.decode(reader) == ProduceResponse(100, 123)
    reader.done()


def test_fetch_response_round_trips_with_its_set_as_a_separate_part():
    body = FetchResponse(900, b"messages").encode_parts()
    assert body[1] == b"messages"  # the broker sends this part with sendfile
    reader = frame_of(2, body)
    assert plain(FetchResponse.read(reader)) == plain(FetchResponse(900, b"messages"))
    reader.done()


def test_multifetch_response_round_trips_entries_and_errors():
    results = [
        PartitionResult(ErrorCode.NONE, FetchResponse(10, b"abc")),
        PartitionResult.failed(UnknownTopic("unknown topic 'nope'")),
        PartitionResult(ErrorCode.NONE, FetchResponse(0, b"")),
    ]
    reader = frame_of(3, encode_results(results))
    assert plain(decode_multifetch(reader)) == plain(results)
    reader.done()


def test_a_file_region_stays_its_own_part_for_sendfile(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(b"..MESSAGES..")
    with open(path, "rb") as f:
        region = FileRegion(f, 2, 8)
        single = FetchResponse(12, region).encode_parts()
        multi = encode_results([PartitionResult.failed(UnknownTopic("no")), PartitionResult(ErrorCode.NONE, FetchResponse(12, region))])
        frame = response_frame(1, multi)
        assert single[1] is region and multi[1] is region and frame[1] is region
        as_sent = b"".join(p.read() if p is region else p for p in frame)
    assert as_sent == body_bytes(response_frame(1, encode_results(
        [PartitionResult.failed(UnknownTopic("no")), PartitionResult(ErrorCode.NONE, FetchResponse(12, b"MESSAGES"))])))


def test_multiproduce_response_round_trips_entries_and_errors():
    results = [PartitionResult(ErrorCode.NONE, ProduceResponse(0, 40)), PartitionResult.failed(UnknownTopic("gone"))]
    reader = frame_of(4, encode_results(results))
    decoded = decode_multiproduce(reader)
    reader.done()
    assert decoded == results
    with pytest.raises(UnknownTopic, match="gone"):
        decoded[1].unwrap()


def test_empty_multi_responses_round_trip():
    assert decode_multifetch(frame_of(5, encode_results([]))) == []
    assert decode_multiproduce(frame_of(5, encode_results([]))) == []


def test_offsets_response_round_trips():
    reader = frame_of(6, [encode_offsets([500, 300, 0])])
    assert decode_offsets(reader) == [500, 300, 0]
    reader.done()


def test_metadata_response_round_trips():
    response = MetadataResponse(
        [BrokerInfo(0, "127.0.0.1", 9092), BrokerInfo(1, "127.0.0.1", 9093)],
        [TopicMetadata("events", 0, [PartitionMetadata(0, 1, [1], 0, 44), PartitionMetadata(1, -1, [0])]),
         TopicMetadata("nope", ErrorCode.UNKNOWN_TOPIC, [])],
    )
    reader = frame_of(7, [response.encode()])
    assert MetadataResponse.decode(reader) == response
    reader.done()


def test_metadata_version_1_adds_leader_epoch_and_isr_and_version_0_is_unchanged():
    response = MetadataResponse(
        [BrokerInfo(0, "127.0.0.1", 9092)],
        [TopicMetadata("events", 0, [PartitionMetadata(0, 2, [2, 0, 1], 0, 44, 7, [2, 0]),
                                     PartitionMetadata(1, -1, [0, 1, 2], -1, -1, 3, [0])])],
    )
    reader = frame_of(7, [response.encode(1)])
    assert MetadataResponse.decode(reader, 1) == response
    reader.done()
    v0 = response.encode(0)
    assert len(response.encode(1)) - len(v0) == (4 + 2 + 2 * 4) + (4 + 2 + 4)
    decoded = MetadataResponse.decode(frame_of(7, [v0]))
    assert [(p.leader, p.leader_epoch, p.isr) for p in decoded.topics[0].partitions] == [(2, 0, []), (-1, 0, [])]


def test_create_topic_response_is_the_header_alone():
    assert response_frame(8, []) == [struct.pack(">iih", 6, 8, 0)]


def test_error_response_carries_its_reason():
    frame = error_response(9, ErrorCode.UNKNOWN_TOPIC, "unknown topic 'nope'")
    correlation_id, code, reader = decode_response_header(frame[4:])
    assert (correlation_id, code) == (9, ErrorCode.UNKNOWN_TOPIC)
    with pytest.raises(UnknownTopic, match="unknown topic 'nope'"):
        raise_for_error(code, reader)


# ----------------------------------------------------- byte layouts of docs/protocol.md


def test_request_frame_layout():
    # int32 size | int16 api_key | int16 api_version (0) | int32 correlation_id | int16+utf8 client_id | body
    frame = encode_request(ApiKey.OFFSETS, 0x01020304, "c", OffsetsRequest("t", 1, -1).encode())
    assert frame == (
        b"\x00\x00\x00\x1e" b"\x00\x04" b"\x00\x00" b"\x01\x02\x03\x04" b"\x00\x01c"
        b"\x00\x01t" b"\x00\x00\x00\x01" + b"\xff" * 8 + b"\x00\x00\x00\x01"
    )


def test_produce_request_layout():
    # int8 acks, int32 timeout_ms, topic, int32 partition, int32 set_size, set
    assert ProduceRequest(-1, 1000, "ab", 2, b"SET").encode() == (
        b"\xff" b"\x00\x00\x03\xe8" b"\x00\x02ab" b"\x00\x00\x00\x02" b"\x00\x00\x00\x03SET"
    )


def test_produce_response_frame_layout():
    # int32 size | int32 correlation_id | int16 error_code | int64 base_offset, int64 next_offset
    assert body_bytes(response_frame(5, [ProduceResponse(1, 2).encode()])) == (
        b"\x00\x00\x00\x16" b"\x00\x00\x00\x05" b"\x00\x00" + struct.pack(">qq", 1, 2)
    )


def test_multifetch_response_layout():
    # int16 n, n × (int16 error_code, FETCH response body or error string); version 0's body
    body = encode_results([PartitionResult(ErrorCode.NONE, FetchResponse(7, b"M", version=0)),
                           PartitionResult(3, None, "no")])
    assert body_bytes(body) == (
        b"\x00\x02" b"\x00\x00" + struct.pack(">qi", 7, 1) + b"M" + b"\x00\x03" b"\x00\x02no"
    )


def test_fetch_response_version_1_says_where_its_set_starts():
    # int64 high_watermark, int64 set_offset, int32 set_size, set
    body = encode_results([PartitionResult(ErrorCode.NONE, FetchResponse(70, b"MM", 44))])
    assert body_bytes(body) == b"\x00\x01" b"\x00\x00" + struct.pack(">qqi", 70, 44, 2) + b"MM"
    decoded = decode_multifetch(Reader(body_bytes(body)))[0].unwrap()
    assert (decoded.high_watermark, decoded.set_offset, bytes(decoded.messages)) == (70, 44, b"MM")


def test_record_count_layouts_and_bad_ranges_refused_with_the_reason():
    # request: topic, int32 partition, int64 start_offset, int64 end_offset; answer: int64 records, start, end
    assert RecordCountRequest("t", 2, 10, -1).encode() == b"\x00\x01t" + struct.pack(">iqq", 2, 10, -1)
    assert RecordCount(3, 10, 90).encode() == struct.pack(">qqq", 3, 10, 90)
    assert RecordCount.decode(Reader(struct.pack(">qqq", 3, 10, 90))) == RecordCount(3, 10, 90)
    for start, end, reason in ((-5, -1, "offsets are >= 0"), (10, -2, "offsets are >= 0"), (10, 9, "below start")):
        with pytest.raises(InvalidRequest, match=reason):
            RecordCountRequest.decode(Reader(b"\x00\x01t" + struct.pack(">iqq", 0, start, end)))


def test_multiproduce_response_layout():
    # int16 n, n × (int16 error_code, int64 base, int64 next — or error string)
    body = encode_results([PartitionResult(ErrorCode.NONE, ProduceResponse(0, 9)), PartitionResult(5, None, "x")])
    assert body_bytes(body) == b"\x00\x02" b"\x00\x00" + struct.pack(">qq", 0, 9) + b"\x00\x05" b"\x00\x01x"


def test_metadata_response_layout():
    # brokers × (int32 id, host, int32 port); topics × (topic, int16 error_code,
    # partitions × (int32 partition, int32 leader, int16 n × int32 replica, int64 earliest, int64 latest))
    response = MetadataResponse([BrokerInfo(1, "h", 2)], [TopicMetadata("t", 0, [PartitionMetadata(0, 1, [1], 3, 4)])])
    assert response.encode() == (
        b"\x00\x00\x00\x01" b"\x00\x00\x00\x01" b"\x00\x01h" b"\x00\x00\x00\x02"
        b"\x00\x00\x00\x01" b"\x00\x01t" b"\x00\x00" b"\x00\x00\x00\x01"
        b"\x00\x00\x00\x00" b"\x00\x00\x00\x01" b"\x00\x01" b"\x00\x00\x00\x01" + struct.pack(">qq", 3, 4)
    )


# ------------------------------------------------------------------ malformed input


def test_a_short_frame_is_an_invalid_request():
    with pytest.raises(InvalidRequest, match="ends early"):
        ProduceRequest.decode(Reader(ProduceRequest(1, 0, "t", 0, b"xyz").encode()[:-5]))


def test_trailing_bytes_are_an_invalid_request():
    with pytest.raises(InvalidRequest, match="unexpected bytes"):
        OffsetsRequest.decode(Reader(OffsetsRequest("t", 0, -1).encode() + b"\x00"))


def test_acks_outside_0_1_minus_1_are_refused():
    with pytest.raises(InvalidRequest, match="acks"):
        ProduceRequest.decode(Reader(ProduceRequest(2, 0, "t", 0, b"").encode()))


def test_replica_fetch_response_round_trips_with_its_set_as_a_separate_part():
    body = ReplicaFetchResponse(900, 3, b"messages").encode_parts()
    assert body[1] == b"messages"  # sent with sendfile, like FETCH
    reader = frame_of(4, body)
    assert plain(ReplicaFetchResponse.decode(reader)) == plain(ReplicaFetchResponse(900, 3, b"messages"))
    reader.done()


def test_replica_fetch_layout():
    body = ReplicaFetchRequest(2, 500, True, (ReplicaFetchPartition("t", 1, 5, 4096, 2048, 100),)).encode()
    assert body == struct.pack(">iibh", 2, 500, 1, 1) + b"\x00\x01t" + struct.pack(">iiqqi", 1, 5, 4096, 2048, 100)
    assert body_bytes(ReplicaFetchResponse(7, 3, b"ab").encode_parts()) == struct.pack(">qii", 7, 3, 2) + b"ab"


def test_a_replica_fetch_answer_names_each_partition_with_its_set_or_its_error():
    results = [PartitionResult(ErrorCode.NONE, ReplicaFetchResponse(7, 3, b"ab")),
               PartitionResult.failed(OffsetOutOfRange("fetch at 9 outside [0, 4]")),
               PartitionResult(ErrorCode.NONE, ReplicaFetchResponse(0, 1, b""))]
    body = encode_results(results, [("a", 0), ("b", 2), ("a", 1)])
    assert body_bytes(body).startswith(struct.pack(">h", 3) + b"\x00\x01a" + struct.pack(">ih", 0, 0))
    decoded = decode_replica_fetch(frame_of(4, body))
    assert [key for key, _ in decoded] == [("a", 0), ("b", 2), ("a", 1)]
    assert [r.error_code for _, r in decoded] == [0, ErrorCode.OFFSET_OUT_OF_RANGE, 0]
    assert plain(decoded[0][1].value) == plain(ReplicaFetchResponse(7, 3, b"ab"))
    assert decoded[1][1].message == "fetch at 9 outside [0, 4]"
    assert plain(decoded[2][1].value) == plain(ReplicaFetchResponse(0, 1, b""))


@pytest.mark.parametrize("body", [
    struct.pack(">iibh", 2, -1, 1, 0),  # negative max_wait_ms
    struct.pack(">iibh", 2, 500, 1, -1),  # negative partition count
    struct.pack(">iibh", 2, 500, 2, 0),  # full is a boolean
    struct.pack(">iibh", 2, 500, 1, 1) + b"\x00\x01t" + struct.pack(">iiqqi", 1, 5, 0, 0, -1),  # negative max_bytes
    struct.pack(">iibh", 2, 500, 1, 2) + b"\x00\x01t" + struct.pack(">iiqqi", 1, 5, 0, 0, 100),  # one partition short
])
def test_a_malformed_replica_fetch_is_an_invalid_request(body):
    with pytest.raises(InvalidRequest):
        ReplicaFetchRequest.decode(Reader(body))


def test_leader_epoch_end_layout_and_round_trip():
    assert LeaderEpochEndRequest("t", 1, 4).encode() == b"\x00\x01t" + struct.pack(">ii", 1, 4)
    assert LeaderEpochEndResponse(3, 1234).encode() == struct.pack(">iq", 3, 1234)
    reader = frame_of(5, [LeaderEpochEndResponse(3, 1234).encode()])
    assert LeaderEpochEndResponse.decode(reader) == LeaderEpochEndResponse(3, 1234)
    reader.done()


def test_replication_error_codes_are_pinned():
    from broker.common.errors import (
        FencedLeaderEpoch, InvalidReplicationFactor, NotEnoughReplicas, NotEnoughReplicasAfterAppend,
        PartitionOffline, RequestTimedOut, error_for,
    )
    for code, cls in [(15, NotEnoughReplicas), (16, NotEnoughReplicasAfterAppend), (17, FencedLeaderEpoch),
                      (18, InvalidReplicationFactor), (19, PartitionOffline), (20, RequestTimedOut)]:
        assert cls.code == code and type(error_for(code)) is cls


def test_delete_topic_layout_and_its_error_code_are_pinned():
    # request: topic, int32 timeout_ms; answer: empty; refusal 30 when delete.topic.enable is off
    from broker.common.errors import TopicDeletionDisabled, error_for

    assert DeleteTopicRequest("t", 500).encode() == b"\x00\x01t" + struct.pack(">i", 500)
    assert ApiKey.DELETE_TOPIC == 13
    assert TopicDeletionDisabled.code == 30 and type(error_for(30)) is TopicDeletionDisabled
