"""The registry's HTTP server: the standard library's ThreadingHTTPServer, one thread
per connection (a request blocks on ZooKeeper anyway, and the load is a few requests
per client start: serializers cache what they learn), wrapped in TLS by `ssl` when a
certificate is given. Chosen over FastAPI/uvicorn because the broker installs without
Airflow, which is what brings those: the registry adds no HTTP dependency.

Bodies are bounded (`max_body_bytes`, 413 beyond, read no further); responses are
`application/vnd.schemaregistry.v1+json` as Confluent's."""

from __future__ import annotations

import json
import logging
import ssl
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from broker.registry import errors
from broker.registry.api import Api

logger = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
MAX_BODY_BYTES = 900_000  # a schema's ZooKeeper node must stay under jute.maxbuffer (1 MiB)
REALM = 'Basic realm="logbus-schema-registry"'
DISCARD_BYTES, DISCARD_SECONDS = 4 << 20, 2.0  # what is read and dropped of a refused body, at most


@dataclass(frozen=True)
class Tls:
    certfile: str
    keyfile: str

    def context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.certfile, self.keyfile)
        return context


class RegistryServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: Api, tls: Tls | None = None,
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        super().__init__(address, RequestHandler)
        self.api, self.max_body_bytes = api, max_body_bytes
        self.tls_context = tls.context() if tls else None

    def get_request(self):
        sock, address = super().get_request()
        if self.tls_context is not None:  # the handshake happens in the request's thread, at its first read
            sock = self.tls_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body go out as two writes: with Nagle's algorithm the second waits for
    # the client's delayed ACK, 40 ms a request (bench/registry.py: 20 requests/s)
    disable_nagle_algorithm = True
    server: RegistryServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._serve()

    do_POST = do_PUT = do_DELETE = do_GET

    def _serve(self) -> None:
        path, _, query = self.path.partition("?")
        try:
            raw = self._read_body()
        except errors.RegistryError as exc:
            self.close_connection = True  # the rest of the body is unread: this connection is done
            self._answer(exc.status, exc.body())
            self._discard_rest()
            return
        status, body = self.server.api.handle(self.command, path, query, raw, self.headers.get("Authorization"))
        self._answer(status, body)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise errors.RegistryError(411, 411, "a Content-Length is required (chunked bodies are not taken)")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise errors.malformed_request("Content-Length is not a number") from None
        if length > self.server.max_body_bytes:
            raise errors.too_large(self.server.max_body_bytes)
        return self.rfile.read(length) if length > 0 else b""

    def _discard_rest(self) -> None:
        """Read on (and drop) a refused body's rest for a moment, bounded: a client writes
        its whole body before it reads, and a socket closed under it would show it a
        reset instead of the 413."""
        self.connection.settimeout(DISCARD_SECONDS)
        try:
            for _ in range(DISCARD_BYTES // 65536):
                if not self.rfile.read1(65536):
                    break
        except OSError:
            pass

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        if status == 401:
            self.send_header("WWW-Authenticate", REALM)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
        logger.debug("%s %s", self.address_string(), format % args)
