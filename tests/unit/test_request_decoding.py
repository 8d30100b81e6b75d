"""The produce path's decoders (issue 38): the request header and the PRODUCE body are
read with one unpack each side of their strings, and fall back to the field-by-field
readers for anything that does not fit. Whatever the bytes, both ways give the same
request — or the same InvalidRequest with its reason — as the field-by-field reader
alone (the decoder before issue 38)."""

from __future__ import annotations

import struct

import pytest

from broker.common.errors import InvalidRequest
from broker.common.protocol import ApiKey, ProduceRequest, Reader, RequestHeader, decode_request_header, encode_request
from broker.common.protocol.frames import _read_header

CLIENT_IDS = ["", "c", "bench", "prödücer-ü", "x" * 300]


def outcome(decode, data):
    """What a decoder makes of `data`: its value and where it stopped reading, or its error."""
    try:
        value, reader = decode(data)
    except InvalidRequest as exc:
        return "error", str(exc)
    return "value", tuple(bytes(v) if isinstance(v, memoryview) else v for v in value), type(value), reader.pos


def header_frames():
    """Valid frames (without their size) of every api and version, and every prefix of each."""
    for api in ApiKey:
        for version in (0, 1, 2, -1):
            for client_id in CLIENT_IDS:
                frame = encode_request(api, 0x12345678, client_id, b"body", version)[4:]
                yield from (frame[:n] for n in range(len(frame) + 1))


def test_a_header_read_in_one_unpack_is_the_field_by_field_read_for_every_api_version_and_prefix():
    checked = 0
    for frame in header_frames():
        assert outcome(decode_request_header, frame) == outcome(_read_header, frame), frame
        checked += 1
    assert checked > 1000


@pytest.mark.parametrize("frame, reason", [
    (struct.pack(">hhih", 0, 0, 1, -1) + b"x", "negative string length at byte 8"),
    (struct.pack(">hhih", 0, 0, 1, 5) + b"abc", "field of 5 bytes at byte 10 runs past the frame end"),
    (struct.pack(">hhih", 0, 0, 1, 2) + b"\xff\xfe", "string at byte 10 is not UTF-8"),
    (struct.pack(">hhi", 0, 0, 1), "frame ends early at byte 8"),
    (b"\x00\x00\x00", "frame ends early at byte 0"),
])
def test_a_malformed_header_gets_its_reason(frame, reason):
    with pytest.raises(InvalidRequest) as raised:
        decode_request_header(frame)
    assert str(raised.value) == reason


def test_a_decoded_header_is_a_request_header_with_the_reader_at_the_body():
    header, reader = decode_request_header(encode_request(ApiKey.FETCH, 7, "prödücer", b"BODY", 1)[4:])
    assert type(header) is RequestHeader
    assert header == RequestHeader(ApiKey.FETCH, 1, 7, "prödücer")
    assert bytes(reader.view[reader.pos:]) == b"BODY"


def produce_bodies():
    """PRODUCE bodies: valid ones, every prefix, one byte more, and fields made wrong."""
    for acks in (0, 1, -1, 2, -2, 127):
        for topic in ("t", "events-ü", "x" * 249):
            for messages in (b"", b"m", b"set" * 100):
                body = ProduceRequest(acks, 1000, topic, 3, messages).encode()
                yield from (body[:n] for n in range(len(body) + 1))
                yield body + b"\x00"
                yield from (body[:at] + value + body[at + len(value):] for at, value in (
                    (5, b"\xff\xff"),  # negative topic length
                    (5, b"\x7f\xff"),  # topic length past the end
                    (7, b"\xc3\x28"),  # not UTF-8
                    (len(body) - len(messages) - 4, b"\xff\xff\xff\xff"),  # negative set size
                    (len(body) - len(messages) - 4, b"\x00\x00\x10\x00"),  # set size past the end
                ))


def test_a_produce_body_read_in_two_unpacks_is_the_field_by_field_read_whatever_its_bytes():
    fast = lambda body: (lambda r: (ProduceRequest.decode(r), r))(Reader(body))  # noqa: E731
    slow = lambda body: (lambda r: (ProduceRequest._read(r), r))(Reader(body))  # noqa: E731
    outcomes = {"value": 0, "error": 0}
    for body in produce_bodies():
        got = outcome(fast, body)
        assert got == outcome(slow, body), body
        outcomes[got[0]] += 1
    assert outcomes["value"] >= 27 and outcomes["error"] > 1000, outcomes


def test_a_produce_body_after_a_header_is_read_from_the_reader_s_position():
    frame = encode_request(ApiKey.PRODUCE, 9, "bench", ProduceRequest(-1, 500, "events", 2, b"SET").encode())[4:]
    header, reader = decode_request_header(frame)
    request = ProduceRequest.decode(reader)
    assert type(request) is ProduceRequest and request.API == ApiKey.PRODUCE
    assert request._replace(messages=bytes(request.messages)) == ProduceRequest(-1, 500, "events", 2, b"SET")
    reader.done()  # everything read
