"""How this broker reaches the others (followers fetching from leaders): on the
inter-broker listener, over TLS with its own certificate when that listener is TLS,
and with its SCRAM credentials when it authenticates. A leader checks that the
principal a follower proves is the one that follower registered."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from scramp import ScramClient

from broker.common.protocol import (
    BrokerInfo, Reader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
)
from broker.server.auth.listeners import inter_broker_listener
from broker.server.auth.tls import ReloadingContexts
from broker.server.config import BrokerConfig

Request = Callable[[object], Awaitable[Reader]]  # send one request, await its answer's body


@dataclass(frozen=True)
class InterBrokerSecurity:
    listener: str
    ssl_context: ssl.SSLContext | None = None
    sasl_mechanism: str = ""
    username: str = ""
    password: str = field(default="", repr=False)

    @classmethod
    def from_config(cls, config: BrokerConfig, tls: ReloadingContexts | None) -> "InterBrokerSecurity":
        inter = inter_broker_listener(config)
        context = tls.client if inter.protocol.tls and tls is not None else None
        if inter.protocol.sasl:
            return cls(inter.name, context, config.inter_broker_sasl_mechanism, config.inter_broker_sasl_username,
                       config.inter_broker_sasl_password)
        return cls(inter.name, context)

    def address(self, broker: BrokerInfo) -> BrokerInfo:
        """The broker on the inter-broker listener (its registered address if it
        registered no listeners)."""
        return broker.at(self.listener) if broker.endpoints else broker

    async def authenticate(self, request: Request) -> None:
        """The SCRAM exchange over a fresh connection; raises the leader's refusal."""
        if not self.sasl_mechanism:
            return
        await request(SaslHandshakeRequest(self.sasl_mechanism))
        client = ScramClient([self.sasl_mechanism], self.username, self.password)
        first = await request(SaslAuthenticateRequest(client.get_client_first().encode()))
        client.set_server_first(SaslAuthenticateResponse.decode(first).auth_bytes.decode())
        final = await request(SaslAuthenticateRequest(client.get_client_final().encode()))
        client.set_server_final(SaslAuthenticateResponse.decode(final).auth_bytes.decode())
