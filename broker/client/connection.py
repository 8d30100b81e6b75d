"""A blocking connection to one broker, with pipelining.

`send` writes a request and returns its correlation id; `receive` reads responses in
order (the broker answers in request order). `request` does both for one call. Every
socket error becomes a `ConnectionError` naming the broker, and the connection is
closed so the caller can reconnect or fail over.
"""

from __future__ import annotations

import itertools
import socket
import ssl
import struct
from collections import deque

from broker.client.security import OPEN, ClientSecurity
from broker.common.errors import InvalidRequest, LogbusError
from broker.common.protocol import (
    FETCH_VERSION, METADATA_VERSION, Acks, ApiKey, CreateTopicRequest, DeleteTopicRequest, FetchRequest, FetchResponse, InitProducerIdRequest,
    MetadataRequest, MetadataResponse, MultiFetchRequest, MultiProduceRequest, OffsetsRequest, PartitionResult,
    ProduceRequest, ProduceResponse, ProducerIdResponse, Reader, RecordCount, RecordCountRequest, decode_multifetch, decode_multiproduce, decode_offsets, decode_response_header, encode_request, client_id_field, request_head,
    raise_for_error,
)

_SIZE = struct.Struct(">i")
MAX_RESPONSE_BYTES = 1 << 30


class BrokerConnection:
    def __init__(self, host: str, port: int, client_id: str = "logbus-python", timeout: float = 30.0,
                 security: ClientSecurity = OPEN) -> None:
        self.host, self.port = host, port
        self.security = security
        self.client_id = client_id
        self._client_field = client_id_field(client_id)  # encoded once
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._ids = itertools.count(1)
        # correlation ids of the requests whose answers are still to come, oldest first;
        # an acks=0 produce is never answered, so it is never recorded (a producer that
        # only sends those would keep one entry per request for as long as it runs)
        self._in_flight: deque[int] = deque()

    def __repr__(self) -> str:
        return f"BrokerConnection({self.host}:{self.port})"

    def connect(self) -> "BrokerConnection":
        if self._sock is None:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            except OSError as exc:
                raise ConnectionError(f"cannot connect to broker {self.host}:{self.port}: {exc}") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock = self.security.wrap(sock, self.host)
            except (ssl.SSLError, ssl.CertificateError, OSError) as exc:
                sock.close()
                raise ConnectionError(f"TLS handshake with broker {self.host}:{self.port} failed: {exc}") from None
            self._sock = sock
            try:
                self.security.authenticate(lambda req: self.call(req.API, req.encode()))
            except BaseException:
                self.close()
                raise
        return self

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._in_flight.clear()

    def __enter__(self) -> "BrokerConnection":
        return self.connect()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    # --------------------------------------------------------------------- raw frames

    def send(self, api: ApiKey, body: bytes, expects_response: bool = True, api_version: int = 0) -> int:
        correlation_id = next(self._ids) & 0x7FFFFFFF
        self.send_frame(encode_request(api, correlation_id, self.client_id, body, api_version))
        if expects_response:
            self._in_flight.append(correlation_id)
        return correlation_id

    def send_many(self, requests: list[tuple[ApiKey, bytes | tuple[bytes, ...], int]],
                  expects_response: bool = True) -> None:
        """Several (api, body, body size) requests written at once: one syscall instead of
        one per request, and one join: a body may be a tuple of pieces (a PRODUCE's
        fields, its set), copied once, into the frame (`request_head`, as `encode_request`'s)."""
        client, ids, pieces, sent = self._client_field, self._ids, [], []
        for api, body, size in requests:
            correlation_id = next(ids) & 0x7FFFFFFF
            pieces.append(request_head(api, correlation_id, client, size))
            if type(body) is tuple:
                pieces.extend(body)
            else:
                pieces.append(body)
            sent.append(correlation_id)
        self.send_frame(b"".join(pieces))
        if expects_response:
            self._in_flight.extend(sent)

    def send_frame(self, frame: bytes) -> None:
        self.connect()
        try:
            self._sock.sendall(frame)
        except OSError as exc:
            self.close()
            raise ConnectionError(f"broker {self.host}:{self.port} connection failed while sending: {exc}") from None

    def receive(self) -> tuple[int, Reader]:
        """The next response: (error_code, reader at its body)."""
        if not self._in_flight:
            raise InvalidRequest("no request is waiting for a response")
        expected = self._in_flight.popleft()
        (size,) = _SIZE.unpack(self._read_exactly(4))
        if not 6 <= size <= MAX_RESPONSE_BYTES:
            self.close()
            raise ConnectionError(f"broker {self.host}:{self.port} sent an impossible response size {size}")
        correlation_id, error_code, reader = decode_response_header(self._read_exactly(size))
        if correlation_id != expected:
            self.close()
            raise ConnectionError(
                f"broker {self.host}:{self.port} answered request {correlation_id}, expected {expected}"
            )
        return error_code, reader

    def _read_exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        try:
            while got < n:
                chunk = self._sock.recv_into(view[got:], n - got)
                if not chunk:
                    raise OSError("connection closed by the broker")
                got += chunk
        except (OSError, AttributeError) as exc:
            self.close()
            raise ConnectionError(f"broker {self.host}:{self.port} connection failed while reading: {exc}") from None
        return bytes(buf)

    def call(self, api: ApiKey, body: bytes, api_version: int = 0) -> Reader:
        """One request, one response; raises the broker's error, if any. Refused while
        answers to earlier requests are unread: answers come in order, and this call
        would take the first of them for its own."""
        if self._in_flight:
            raise InvalidRequest(f"{len(self._in_flight)} earlier answers are unread on this connection: read them "
                                 "before a call")
        self.send(api, body, api_version=api_version)
        error_code, reader = self.receive()
        raise_for_error(error_code, reader)
        return reader

    # ------------------------------------------------------------------- typed calls

    def produce(self, topic: str, partition: int, messages: bytes, acks: int = Acks.APPENDED,
                timeout_ms: int = 30_000) -> ProduceResponse | None:
        body = ProduceRequest(acks, timeout_ms, topic, partition, messages).encode()
        if acks == Acks.NONE:
            self.send(ApiKey.PRODUCE, body, expects_response=False)
            return None
        return ProduceResponse.decode(self.call(ApiKey.PRODUCE, body))

    def multiproduce(self, parts, acks: int = Acks.APPENDED, timeout_ms: int = 30_000) -> list[PartitionResult] | None:
        body = MultiProduceRequest(acks, timeout_ms, list(parts)).encode()
        if acks == Acks.NONE:
            self.send(ApiKey.MULTIPRODUCE, body, expects_response=False)
            return None
        return decode_multiproduce(self.call(ApiKey.MULTIPRODUCE, body))

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20,
              max_wait_ms: int = 0, min_bytes: int = 0) -> FetchResponse:
        """The set holding the record at `offset` (version 1): it starts at the answer's
        `set_offset`, below `offset` when that is a record inside an entry."""
        request = FetchRequest(topic, partition, offset, max_bytes, max_wait_ms, min_bytes).encode()
        return FetchResponse.read(self.call(ApiKey.FETCH, request, FETCH_VERSION))

    def multifetch(self, fetches: list[FetchRequest]) -> list[PartitionResult]:
        reader = self.call(ApiKey.MULTIFETCH, MultiFetchRequest(fetches).encode(), FETCH_VERSION)
        return decode_multifetch(reader)

    def offsets(self, topic: str, partition: int, time: int, max_offsets: int = 1) -> list[int]:
        return decode_offsets(self.call(ApiKey.OFFSETS, OffsetsRequest(topic, partition, time, max_offsets).encode()))

    def record_count(self, topic: str, partition: int, start: int, end: int = -1) -> RecordCount:
        """RECORD_COUNT: the records with offsets in [start, end) — end -1: the visible
        end — as the broker clamped the range (RecordCount.start, .end)."""
        request = RecordCountRequest(topic, partition, start, end).encode()
        return RecordCount.decode(self.call(ApiKey.RECORD_COUNT, request))

    def metadata(self, topics: list[str] | None = None, version: int = METADATA_VERSION) -> MetadataResponse:
        """Version 1 (the default) adds each partition's leader epoch and ISR."""
        reader = self.call(ApiKey.METADATA, MetadataRequest(list(topics or [])).encode(), version)
        return MetadataResponse.decode(reader, version)

    def init_producer_id(self) -> ProducerIdResponse:
        return ProducerIdResponse.decode(self.call(ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest().encode()))

    def create_topic(self, topic: str, partitions: int, replication_factor: int = 1) -> None:
        self.call(ApiKey.CREATE_TOPIC, CreateTopicRequest(topic, partitions, replication_factor).encode())

    def delete_topic(self, topic: str, timeout_ms: int = 30_000) -> None:
        """Delete a topic: returns once the deletion is complete (its data gone from
        every live replica's metadata, the name free again); RequestTimedOut when it is
        not within `timeout_ms` (it goes on); <= 0 returns once it is marked. The
        socket's timeout is stretched to cover the wait."""
        self.connect()
        self._sock.settimeout(max(self.timeout, timeout_ms / 1000 + 5))
        try:
            self.call(ApiKey.DELETE_TOPIC, DeleteTopicRequest(topic, timeout_ms).encode())
        finally:
            if self._sock is not None:
                self._sock.settimeout(self.timeout)


__all__ = ["BrokerConnection", "LogbusError"]
