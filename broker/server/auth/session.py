"""A connection's identity: the listener it came in on, the peer's address, and the
principal it proved — `User:ANONYMOUS` until it proves one, for good on a listener
that does not authenticate."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.server.auth.listeners import Listener
from broker.server.auth.plain import PlainExchange
from broker.server.auth.sasl import SaslExchange
from broker.server.auth.tls import ANONYMOUS


@dataclass
class Session:
    listener: Listener
    host: str
    principal: str = ANONYMOUS
    authenticated: bool = True  # False on a SASL listener until the handshake succeeds
    sasl: SaslExchange | PlainExchange | None = field(default=None, repr=False)

    @property
    def peer(self) -> str:
        return f"{self.principal}@{self.host}"
