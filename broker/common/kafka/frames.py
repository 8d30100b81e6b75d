"""Kafka's frames (docs/kafka.md, "Frames"): a 4-byte size, a request header, an API
message; a response header, an API message.

The API messages are kio's (Aiven's dataclasses generated from Kafka's own JSON
schemas: flexible versions, tagged fields, both directions), so no message layout is
written here by hand. What is written here is what kio leaves to a server: which
header version a request carries (v0 for ControlledShutdown v0 only, v1 for
non-flexible requests, v2 for flexible ones), which one a response carries (v1 for
flexible responses, v0 otherwise, and always v0 for ApiVersions so that a client
that sent a version the broker does not know can still read the answer), and the
ApiVersions v0 reply a broker owes to an ApiVersions request of a version it does
not serve (KIP-511).
"""

from __future__ import annotations

import datetime
import io
import struct
import sys
from functools import lru_cache
from typing import Any, NamedTuple

from kio.index import load_request_schema, load_response_schema
from kio.schema.api_versions.v0.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16

from broker.common.kafka.apis import API_VERSIONS, CONTROLLED_SHUTDOWN, SERVED

SIZE = struct.Struct(">i")
_FIXED = struct.Struct(">hhi")  # request_api_key, request_api_version, correlation_id: every header starts so
_INT16 = struct.Struct(">h")
_CORRELATION = struct.Struct(">i")


class KafkaFrameError(ValueError):
    """A frame that cannot be a Kafka request: too short, a bad string or tagged
    field, a body that does not decode. The connection that sent it is closed (a
    client cannot be answered when its request cannot be read)."""


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # bytes of the header: where the body starts


def request_header_version(api_key: int, api_version: int) -> int:
    """0 for ControlledShutdown v0, 2 for a flexible request, else 1."""
    if api_key == CONTROLLED_SHUTDOWN and api_version == 0:
        return 0
    return 2 if is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """1 for a flexible response, else 0; ApiVersions' is always 0 (KIP-511)."""
    return 1 if api_key != API_VERSIONS and is_flexible(api_key, api_version) else 0


@lru_cache(maxsize=None)
def is_flexible(api_key: int, api_version: int) -> bool:
    return bool(request_schema(api_key, api_version).__flexible__)


@lru_cache(maxsize=None)
def request_schema(api_key: int, api_version: int) -> type:
    """kio's request class; raises KeyError for a key or version kio does not know."""
    try:
        return load_request_schema(api_key, api_version)
    except Exception as exc:  # kio's UnknownAPIKey / UnknownEntity
        raise KeyError(f"no schema for API key {api_key} version {api_version}") from exc


def peek(frame: bytes | memoryview) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id): the fields every header version starts
    with, readable even when the version is not served (to answer it)."""
    if len(frame) < _FIXED.size:
        raise KafkaFrameError(f"a request of {len(frame)} bytes is shorter than a request header")
    return _FIXED.unpack_from(frame, 0)


def decode_request_header(frame: bytes | memoryview, version: int | None = None) -> RequestHeader:
    """The header of a request frame (without its size field), of `version` or the
    one its API key and version call for."""
    api_key, api_version, correlation_id = peek(frame)
    if version is None:
        version = request_header_version(api_key, api_version)
    pos, client_id = _FIXED.size, None
    if version >= 1:
        client_id, pos = _nullable_string(frame, pos)
    if version >= 2:
        pos = skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


def decode_request(frame: bytes | memoryview) -> tuple[RequestHeader, Any]:
    """The header and kio request of a frame of a served API key and version (the
    caller checks `apis.served` first: this raises KeyError otherwise)."""
    api_key, api_version, _ = peek(frame)
    schema = request_schema(api_key, api_version)
    header = decode_request_header(frame)
    if isinstance(frame, memoryview) and not frame.readonly:
        # a frame larger than the connection's scratch buffer comes in a writable buffer
        # of its own (broker/server/connection.py), which kio's reader refuses
        frame = frame.toreadonly()
    try:
        request, size = entity_reader(schema)(frame, header.size)
    except Exception as exc:  # kio raises BufferUnderflow, ValueError, UnicodeDecodeError...
        raise KafkaFrameError(f"{schema.__name__} v{api_version} does not decode: {exc}") from exc
    # Bytes after the message are ignored, as Kafka's broker ignores them: librdkafka
    # 2.x sends three after its Metadata v12 request for every topic (seen in the
    # capture of tests/unit/kafka_capture.py), and Kafka answers it.
    return header, request


def encode_response(header: RequestHeader, response: Any) -> bytes:
    """The whole frame (size field included) answering `header` with kio `response`."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(_CORRELATION.pack(header.correlation_id))
    if response_header_version(header.api_key, header.api_version):
        out.write(b"\0")  # no tagged fields
    entity_writer(type(response))(out, response)
    frame = out.getbuffer()
    SIZE.pack_into(frame, 0, len(frame) - 4)
    del frame
    return out.getvalue()


def api_versions_response(version: int, error: ErrorCode = ErrorCode.none) -> Any:
    """The ApiVersions answer of `version` listing every served API key's range."""
    schema = sys.modules[load_response_schema(API_VERSIONS, version).__module__]
    keys = tuple(schema.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                 for k, (lo, hi) in sorted(SERVED.items()))
    extra = {"throttle_time": datetime.timedelta(0)} if version else {}
    return schema.ApiVersionsResponse(error_code=error, api_keys=keys, **extra)


def unsupported_api_versions(correlation_id: int) -> bytes:
    """What a broker sends for an ApiVersions request of a version it does not serve:
    a v0 response (header v0) with UNSUPPORTED_VERSION and the served ranges, which
    every client can read and retry with a version from (KIP-511)."""
    keys = tuple(ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                 for k, (lo, hi) in sorted(SERVED.items()))
    header = RequestHeader(API_VERSIONS, 0, correlation_id, None, 0)
    return encode_response(header, ApiVersionsResponse(error_code=ErrorCode.unsupported_version, api_keys=keys))


def _nullable_string(frame: bytes | memoryview, pos: int) -> tuple[str | None, int]:
    if len(frame) < pos + 2:
        raise KafkaFrameError("request header ends inside its client id's length")
    (length,) = _INT16.unpack_from(frame, pos)
    pos += 2
    if length == -1:
        return None, pos
    if length < 0 or len(frame) < pos + length:
        raise KafkaFrameError(f"request header's client id of length {length} runs past the frame")
    try:
        return bytes(frame[pos : pos + length]).decode(), pos + length
    except UnicodeDecodeError as exc:
        raise KafkaFrameError(f"request header's client id is not UTF-8: {exc}") from None


def read_uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """An unsigned varint at `pos`: (value, position after it)."""
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise KafkaFrameError("varint runs past the end of the frame")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise KafkaFrameError("varint longer than 5 bytes")


def skip_tagged_fields(buf: bytes | memoryview, pos: int) -> int:
    """Past a tagged-field section (a header's: none is defined that a broker reads)."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _, pos = read_uvarint(buf, pos)  # tag
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise KafkaFrameError("tagged field runs past the end of the frame")
    return pos
