"""A connection on a Kafka listener: the native connection's framing, receive buffers,
back-pressure and answer queue (`broker.server.connection`), with Kafka's request
headers and messages (`broker.common.kafka.frames`) and the Kafka handlers
(`broker.server.kafka.requests`) behind it.

What cannot be answered closes the connection, as Kafka's broker does: a frame whose
header does not decode, or an API key no schema knows. Everything else is answered,
never dropped: an ApiVersions request of a version not served gets KIP-511's v0
answer, and a request of a known API the listener does not serve (transactions,
KRaft's APIs, an unserved version) gets that API's response carrying
UNSUPPORTED_VERSION.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode as KafkaError

from broker.common.errors import AuthenticationError, LogbusError
from broker.common.kafka.apis import API_VERSIONS, ApiKey, served
from broker.common.kafka.errors import kafka_error
from broker.common.kafka.frames import (
    KafkaFrameError, RequestHeader, decode_request, decode_request_header, encode_response, peek,
    unsupported_api_versions,
)
from broker.server.connection import Connection
from broker.server.kafka.messages import error_response
from broker.server.replies import Reply

logger = logging.getLogger(__name__)


def api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"API {api_key}"


class KafkaConnection(Connection):
    """One client connection on a Kafka listener."""

    @staticmethod
    def _too_large_answer(correlation_id: int, text: str) -> list[bytes]:
        """Nothing: Kafka's broker closes a connection whose request is over
        `socket.request.max.bytes` without an answer (no response of the request's
        API can be built from its first bytes), and so does this one."""
        return []

    def _dispatch(self, frame: bytes | memoryview) -> None:
        try:
            api_key, api_version, correlation_id = peek(frame)
            if not served(api_key, api_version):
                self._refuse_unserved(frame, api_key, api_version, correlation_id)
                return
            header, request = decode_request(frame)
        except (KafkaFrameError, KeyError) as exc:
            logger.warning("%s: unreadable Kafka request (%s); closing", self.peer, exc)
            self.close()
            return
        try:
            reply = self.server.kafka.handle(header, request, self.session)
        except Exception as exc:
            self.answers.ready([self._refusal(header, exc)])
            return
        if not reply.done():
            self.answers.queued(self._answer(header, reply))
            return
        try:
            response = reply.result()
        except Exception as exc:
            self.answers.ready([self._refusal(header, exc)])
            return
        if response is not None:  # None: a produce request with acks=0, never answered
            self.answers.ready([encode_response(header, response)])

    async def _answer(self, header: RequestHeader, reply: Reply) -> list[bytes] | None:
        try:
            response = await reply
        except Exception as exc:
            return [self._refusal(header, exc)]
        return None if response is None else [encode_response(header, response)]

    def _refuse_unserved(self, frame: bytes | memoryview, api_key: int, api_version: int, correlation_id: int) -> None:
        if api_key == API_VERSIONS:
            self.answers.ready([unsupported_api_versions(correlation_id)])
            return
        header = decode_request_header(frame)  # KeyError for a key no schema knows: closed
        self.refusals.warning(f"unserved {api_key}", "%s v%d is not served (UNSUPPORTED_VERSION)",
                              api_name(api_key), api_version)
        self.answers.ready([encode_response(header, error_response(
            api_key, api_version, KafkaError.unsupported_version,
            f"{api_name(api_key)} v{api_version} is not served by logbus (docs/kafka.md)"))])

    def _refusal(self, header: RequestHeader, exc: Exception) -> bytes:
        """A request refused whole: the API's response with the error's Kafka code."""
        if isinstance(exc, LogbusError):
            self.refusals.warning(f"{header.api_key} {type(exc).__name__}", "%s request %d refused: %s",
                                  api_name(header.api_key), header.correlation_id, exc)
            code, text = kafka_error(exc.code), str(exc)
            if isinstance(exc, AuthenticationError):
                self.answers.close_after = True  # a failed handshake ends the connection, once answered
        else:
            logger.error("%s: %s request %d failed", self.peer, api_name(header.api_key), header.correlation_id,
                         exc_info=exc)
            code, text = KafkaError.unknown_server_error, "internal broker error; see its log"
        return encode_response(header, error_response(header.api_key, header.api_version, code, text))
