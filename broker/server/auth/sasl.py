"""The broker's side of the SASL/SCRAM handshake (RFC 5802, RFC 7677; Kafka's KIP-84),
on scramp's SCRAM implementation: SASL_HANDSHAKE picks a mechanism, then two
SASL_AUTHENTICATE rounds carry the client-first/server-first and the
client-final/server-final messages.

Nothing says whether a user exists. An unknown user is answered as a known one is —
a salt of the same length, the same for that name and mechanism on every broker and at
every attempt (a keyed hash under the cluster's secret, `ScramSettings`), and the
cluster's iteration count, which every user is stored with — and fails at the proof
like a wrong password, with the same refusal. A replayed client-final fails because
each handshake has a fresh server nonce."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kazoo.client import KazooClient
from scramp import ScramException, ScramMechanism

from broker.common.errors import IllegalSaslState, SaslAuthenticationFailed, UnsupportedSaslMechanism
from broker.common.passwords import ClusterCredentials, Lookup, decoy  # noqa: F401 (decoy: re-exported)
from broker.common.protocol import (
    Body, Reader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
)
from broker.common.zkauth import ZooKeeperAuth
from broker.server.config import BrokerConfig
from broker.server.replies import Reply, answered, later

if TYPE_CHECKING:
    from broker.server.auth.session import Session

logger = logging.getLogger(__name__)

REFUSED = "authentication failed: invalid credentials"


class SaslExchange:
    """One connection's handshake: `start(mechanism)`, then `step(message)` until it
    returns the principal (the exchange is complete) or raises."""

    def __init__(self, mechanisms: tuple[str, ...], lookup: Lookup) -> None:
        self.mechanisms = mechanisms
        self.lookup = lookup
        self.mechanism: str | None = None
        self.user: str | None = None
        self._server = None
        self._round = 0

    def start(self, mechanism: str) -> None:
        if self.mechanism is not None:
            raise IllegalSaslState("SASL_HANDSHAKE sent twice on one connection")
        if mechanism not in self.mechanisms:
            raise UnsupportedSaslMechanism(f"SASL mechanism {mechanism!r} is not enabled; this listener accepts "
                                           f"{', '.join(self.mechanisms)}")
        self.mechanism = mechanism
        self._server = ScramMechanism(mechanism).make_server(self._credential)

    def step(self, message: bytes) -> tuple[bytes, str | None]:
        """The answer to one client message, and the principal once authenticated.
        Blocking (reads ZooKeeper): run it off the event loop."""
        if self._server is None:
            raise IllegalSaslState("SASL_AUTHENTICATE before SASL_HANDSHAKE")
        try:
            text = message.decode("utf-8")
            if self._round == 0:
                self._round = 1
                self._server.set_client_first(text)
                return self._server.get_server_first().encode(), None
            if self._round == 1:
                self._round = 2
                self._server.set_client_final(text)
                return self._server.get_server_final().encode(), f"User:{self.user}"
        except (ScramException, UnicodeDecodeError, ValueError) as exc:
            logger.info("SCRAM handshake of user %r refused: %s", self.user, exc)
            raise SaslAuthenticationFailed(REFUSED) from None
        raise IllegalSaslState("the SCRAM exchange is already complete")

    def _credential(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        self.user = user
        return self.lookup(user, self.mechanism).as_tuple()


class Authentication:
    """The handlers of SASL_HANDSHAKE and SASL_AUTHENTICATE: each connection's exchange
    lives on its `Session`; credentials are read from ZooKeeper at every handshake, so a
    changed password holds for the next connection."""

    def __init__(self, config: BrokerConfig, zk: KazooClient) -> None:
        self.mechanisms = tuple(m for m in config.sasl_enabled_mechanisms if m != "PLAIN")  # PLAIN: Kafka's only
        self.zk = zk
        self.credentials = ClusterCredentials(zk, ZooKeeperAuth(config.zookeeper_auth,
                                                                config.zookeeper_set_acl).private_acl)
        self.lookup = self.credentials.lookup  # the user's credential or a decoy; the Kafka listener's exchanges share it

    def handshake(self, reader: Reader, session: "Session") -> Reply:
        req = SaslHandshakeRequest.decode(reader)
        if not session.listener.protocol.sasl:
            raise IllegalSaslState(f"listener {session.listener.name} ({session.listener.protocol.value}) "
                                   "does not authenticate with SASL")
        if session.authenticated:
            raise IllegalSaslState("this connection is already authenticated")
        if session.sasl is None:
            session.sasl = SaslExchange(self.mechanisms, self.lookup)
        session.sasl.start(req.mechanism)
        return answered([SaslHandshakeResponse(list(self.mechanisms)).encode()])

    def authenticate(self, reader: Reader, session: "Session") -> Reply:
        req = SaslAuthenticateRequest.decode(reader)
        if session.authenticated or session.sasl is None:
            raise IllegalSaslState("SASL_AUTHENTICATE outside a handshake")
        return later(self._step(session, req.auth_bytes))

    async def _step(self, session: "Session", message: bytes) -> Body:
        return [SaslAuthenticateResponse(await self.step(session, message)).encode()]

    @staticmethod
    async def step(session: "Session", message: bytes) -> bytes:
        """One round of the session's exchange, off the event loop (it reads
        ZooKeeper); the session takes the principal once it is proven. Shared with
        the Kafka listener (`broker.server.kafka.sasl`)."""
        answer, principal = await asyncio.get_running_loop().run_in_executor(None, session.sasl.step, message)
        if principal is not None:
            session.principal, session.authenticated, session.sasl = principal, True, None
            logger.info("%s authenticated as %s on listener %s", session.host, principal, session.listener.name)
        return answer
