"""A socket server that answers a real Kafka client just far enough to make it produce
(ApiVersions, Metadata, InitProducerId, Produce) and keeps every request frame it
read: the client's own bytes, for tests of the codecs (broker.common.kafka) — the
client is not mocked, and the codecs under test decode what it sent."""

from __future__ import annotations

import datetime
import socket
import struct
import threading
from dataclasses import fields
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from broker.common.kafka import frames
from broker.common.kafka.apis import ApiKey, served

PRODUCER_ID = 4242


def build(schema: type, **values: Any) -> Any:
    """A kio entity of `schema` from the values among `values` that this version has."""
    names = {f.name for f in fields(schema)}
    if "throttle_time" in values:
        values["throttle_time"] = datetime.timedelta(milliseconds=values["throttle_time"])
    return schema(**{k: v for k, v in values.items() if k in names})


class CaptureBroker:
    """One listening socket, a thread per connection; `frames` holds every request
    frame read (without its size field), in arrival order."""

    def __init__(self, topic: str = "t") -> None:
        self.topic = topic
        self.frames: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._lock = threading.Lock()
        self._stopped = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def requests(self, api_key: int) -> list[bytes]:
        with self._lock:
            return [f for f in self.frames if frames.peek(f)[0] == api_key]

    def close(self) -> None:
        """Stop accepting: a listening socket closed under a thread blocked in `accept`
        does not wake it on Linux, a shutdown does."""
        self._stopped = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._acceptor.join(10)

    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    frame = _read_exactly(conn, struct.unpack(">i", _read_exactly(conn, 4))[0])
                    with self._lock:
                        self.frames.append(frame)
                    answer = self._answer(frame)
                    if answer:
                        conn.sendall(answer)
            except (ConnectionError, OSError):
                return

    def _answer(self, frame: bytes) -> bytes | None:
        api_key, version, correlation_id = frames.peek(frame)
        if api_key == ApiKey.API_VERSIONS and not served(api_key, version):
            return frames.unsupported_api_versions(correlation_id)
        header, request = frames.decode_request(frame)
        if api_key == ApiKey.API_VERSIONS:
            return frames.encode_response(header, frames.api_versions_response(version))
        module = __import__(load_response_schema(api_key, version).__module__, fromlist=["x"])
        if api_key == ApiKey.METADATA:
            return frames.encode_response(header, self._metadata(module))
        if api_key == ApiKey.INIT_PRODUCER_ID:
            return frames.encode_response(header, build(
                module.InitProducerIdResponse, throttle_time=0, error_code=ErrorCode.none,
                producer_id=PRODUCER_ID, producer_epoch=0))
        if api_key == ApiKey.PRODUCE:
            if request.acks == 0:
                return None
            topics = tuple(build(module.TopicProduceResponse, name=t.name, partition_responses=tuple(
                build(module.PartitionProduceResponse, index=p.index, error_code=ErrorCode.none, base_offset=0,
                      log_start_offset=0, record_errors=()) for p in t.partition_data)) for t in request.topic_data)
            return frames.encode_response(header, build(module.ProduceResponse, responses=topics, throttle_time=0))
        raise ConnectionError(f"the capture broker does not answer API key {api_key}")

    def _metadata(self, module: Any) -> Any:
        broker = build(module.MetadataResponseBroker, node_id=0, host="127.0.0.1", port=self.port, rack=None)
        partition = build(module.MetadataResponsePartition, error_code=ErrorCode.none, partition_index=0,
                          leader_id=0, leader_epoch=0, replica_nodes=(0,), isr_nodes=(0,), offline_replicas=())
        topic = build(module.MetadataResponseTopic, error_code=ErrorCode.none, name=self.topic, topic_id=None,
                      is_internal=False, partitions=(partition,))
        return build(module.MetadataResponse, throttle_time=0, error_code=ErrorCode.none, brokers=(broker,), cluster_id="capture",
                     controller_id=0, topics=(topic,))


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return bytes(out)
