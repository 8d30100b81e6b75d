"""Request and response frames (docs/protocol.md): the request header, and the
response header whose error code, when not 0, is followed by a string explaining the
error in place of the body — so a client can show the broker's reason."""

from __future__ import annotations

import functools
import struct
from typing import NamedTuple

from broker.common.errors import ErrorCode, InvalidRequest, error_for
from broker.common.protocol.primitives import API_VERSION, ApiKey, Reader, SIZE, Writer


REQUEST_HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id (+ client_id)


RESPONSE_HEADER = struct.Struct(">iih")  # size, correlation_id, error_code
# Enum members as constants on a hot path (docs/architecture.md, "Enum members on hot paths").
_OK = ErrorCode.NONE


class RequestHeader(NamedTuple):
    """One per request: `decode_request_header` builds it with `tuple.__new__` (in C; the
    frozen dataclasses' `__init__`s of the produce path were a seventh of the broker's
    CPU per request at batch 1)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str


_FRAME_HEAD = struct.Struct(">i" + REQUEST_HEADER.format.lstrip(">"))  # size, then the header before client_id


def client_id_field(client_id: str) -> bytes:
    """A request header's client_id as encoded: a client encodes it once."""
    return bytes(Writer().string(client_id).buf)


def request_head(api_key: ApiKey, correlation_id: int, client_field: bytes, body_size: int,
                 api_version: int = API_VERSION) -> bytes:
    """A request frame's bytes before its body (size, header, `client_field`), so a
    sender can join the head and the body's pieces once, into the frame."""
    size = _FRAME_HEAD.size - 4 + len(client_field) + body_size
    return _FRAME_HEAD.pack(size, api_key, api_version, correlation_id) + client_field


def encode_request(api_key: ApiKey, correlation_id: int, client_id: str, body: bytes | bytearray,
                   api_version: int = API_VERSION) -> bytes:
    return request_head(api_key, correlation_id, client_id_field(client_id), len(body), api_version) + body


_HEADER_FIELDS = struct.Struct(REQUEST_HEADER.format + "h")  # ... and client_id's length: one unpack
_new_header = functools.partial(tuple.__new__, RequestHeader)


def decode_request_header(frame: bytes | memoryview) -> tuple[RequestHeader, Reader]:
    """Parse the header of a frame (without its size field). The produce path's first
    step, hence one unpack and a C-made tuple; a frame that does not fit that shape is
    read field by field (`_read_header`), which says what is wrong with it."""
    try:
        api_key, api_version, correlation_id, n = _HEADER_FIELDS.unpack_from(frame)
        end = _HEADER_FIELDS.size + n
        if 0 <= n and end <= len(frame):
            client_id = str(frame[_HEADER_FIELDS.size : end], "utf-8")
            return _new_header((api_key, api_version, correlation_id, client_id)), Reader(frame, end)
    except (struct.error, UnicodeDecodeError):
        pass
    return _read_header(frame)


def _read_header(frame: bytes | memoryview) -> tuple[RequestHeader, Reader]:
    """`decode_request_header` field by field: the clear error of a malformed header."""
    r = Reader(frame)
    api_key, api_version, correlation_id = r._unpack(REQUEST_HEADER)
    return RequestHeader(api_key, api_version, correlation_id, r.string()), r


# A response body is a list of parts: bytes, and in fetch responses the message set as
# given — bytes in clients and tests, a file region the broker sends with sendfile (any
# object with a length). `response_frame` puts the header in front.
Body = list


def response_header(correlation_id: int, error_code: int, body_size: int) -> bytes:
    return RESPONSE_HEADER.pack(body_size + 6, correlation_id, error_code)


def response_frame(correlation_id: int, body: Body) -> Body:
    """The frame of a successful response, the header joined to the first part so that a
    small response is one write."""
    if len(body) == 1 and type(body[0]) is bytes:  # most responses: one write, nothing to add up
        return [RESPONSE_HEADER.pack(len(body[0]) + 6, correlation_id, _OK) + body[0]]
    head = response_header(correlation_id, _OK, sum(map(len, body)))
    if body and isinstance(body[0], bytes):
        return [head + body[0], *body[1:]]
    return [head, *body]


def error_response(correlation_id: int, error_code: int, message: str) -> bytes:
    body = Writer().string(message[:2000]).buf
    return response_header(correlation_id, error_code, len(body)) + body


def decode_response_header(frame: bytes | memoryview) -> tuple[int, int, Reader]:
    """(correlation_id, error_code, reader at the body) of a frame without its size."""
    r = Reader(frame)
    return r.int32(), r.int16(), r


def raise_for_error(error_code: int, r: Reader) -> None:
    """Raise the error a response carries, with the broker's explanation."""
    if error_code != _OK:
        try:
            message = r.string()
        except InvalidRequest:
            message = ""
        raise error_for(error_code, message)
