"""SASL/PLAIN (RFC 4616) checked against the cluster's SCRAM credentials: the broker
keeps no password, only each user's salted SCRAM keys (`broker.common.credentials`),
so the password PLAIN carries is checked as `broker.common.passwords` does for every
password (the schema registry's HTTP Basic too): an unknown user meets the same decoy
credentials and the same work as SCRAM shows it, and the same refusal.

PLAIN sends the password itself: the Kafka listener offers it only inside TLS
(`broker.server.kafka.sasl`)."""

from __future__ import annotations

import logging

from broker.common.errors import IllegalSaslState, SaslAuthenticationFailed
from broker.common.passwords import password_matches
from broker.server.auth.sasl import REFUSED, Lookup

logger = logging.getLogger(__name__)

PLAIN = "PLAIN"


class PlainExchange:
    """One connection's PLAIN exchange: a single message, `authzid NUL user NUL password`."""

    mechanism = PLAIN

    def __init__(self, lookup: Lookup) -> None:
        self.lookup = lookup
        self._done = False

    def step(self, message: bytes) -> tuple[bytes, str | None]:
        """(b"", the principal), or SaslAuthenticationFailed. Blocking (reads ZooKeeper,
        derives keys): run it off the event loop."""
        if self._done:
            raise IllegalSaslState("the PLAIN exchange is already complete")
        self._done = True
        try:
            authzid, user, password = message.decode("utf-8").split("\0")
        except (UnicodeDecodeError, ValueError):
            logger.info("PLAIN message refused: not authzid NUL user NUL password")
            raise SaslAuthenticationFailed(REFUSED) from None
        if authzid not in ("", user) or not user or not password:
            logger.info("PLAIN authentication of user %r refused: empty user or password, or another authzid", user)
            raise SaslAuthenticationFailed(REFUSED)
        if not password_matches(self.lookup, user, password):
            logger.info("PLAIN authentication of user %r refused", user)
            raise SaslAuthenticationFailed(REFUSED)
        return b"", f"User:{user}"
