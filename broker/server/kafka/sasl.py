"""SASL on the Kafka listener (docs/kafka.md, "SASL"): SaslHandshake v1 picks the
mechanism, then SaslAuthenticate frames carry its messages — the native listener's
exchange (`broker.server.auth.sasl`: SCRAM-SHA-256/512 on the cluster's credentials,
an unknown user refused as a wrong password is) in Kafka's messages, and PLAIN on
listeners with TLS when `sasl.enabled.mechanisms` names it (`broker.server.auth.plain`,
checked against the same SCRAM credentials).

SaslHandshake v0 is not served: after it the client sends the mechanism's bytes
without Kafka's framing, which this listener does not read. A failed authentication
is answered SASL_AUTHENTICATION_FAILED and the connection closed after the answer
(`KafkaConnection`), as Kafka does."""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode as KafkaError

from broker.common.errors import IllegalSaslState
from broker.common.kafka.apis import ApiKey
from broker.server.auth.listeners import Listener
from broker.server.auth.plain import PLAIN, PlainExchange
from broker.server.auth.sasl import Authentication, SaslExchange
from broker.server.auth.session import Session
from broker.server.kafka.messages import response
from broker.server.replies import Reply, answered, later


class KafkaSasl:
    def __init__(self, authentication: Authentication, enabled: tuple[str, ...]) -> None:
        self.authentication = authentication
        self.plain = PLAIN in enabled

    def handlers(self) -> dict[int, Any]:
        return {ApiKey.SASL_HANDSHAKE: self.handshake, ApiKey.SASL_AUTHENTICATE: self.authenticate}

    def mechanisms(self, listener: Listener) -> tuple[str, ...]:
        """SCRAM everywhere; PLAIN, whose message is the password, only inside TLS."""
        scram = self.authentication.mechanisms
        return scram + (PLAIN,) if self.plain and listener.protocol.tls else scram

    def handshake(self, request: Any, version: int, session: Session) -> Reply:
        if not session.listener.protocol.sasl:
            raise IllegalSaslState(f"listener {session.listener.name} ({session.listener.protocol.value}) "
                                   "does not authenticate with SASL")
        if session.authenticated or session.sasl is not None:
            raise IllegalSaslState("SaslHandshake sent twice on one connection")
        mechanisms = self.mechanisms(session.listener)
        error = KafkaError.none
        if request.mechanism == PLAIN and PLAIN in mechanisms:
            session.sasl = PlainExchange(self.authentication.lookup)
        elif request.mechanism in mechanisms:
            session.sasl = SaslExchange(self.authentication.mechanisms, self.authentication.lookup)
            session.sasl.start(request.mechanism)
        else:  # the client may pick another from the list, as Kafka allows
            error = KafkaError.unsupported_sasl_mechanism
        return answered(response(ApiKey.SASL_HANDSHAKE, version, error_code=error, mechanisms=mechanisms))

    def authenticate(self, request: Any, version: int, session: Session) -> Reply:
        if session.authenticated or session.sasl is None:
            raise IllegalSaslState("SaslAuthenticate outside a handshake")
        return later(self._step(version, session, request.auth_bytes))

    async def _step(self, version: int, session: Session, message: bytes) -> Any:
        answer = await self.authentication.step(session, message)
        return response(ApiKey.SASL_AUTHENTICATE, version, error_code=KafkaError.none, error_message=None,
                        auth_bytes=answer, session_lifetime=datetime.timedelta(0))
