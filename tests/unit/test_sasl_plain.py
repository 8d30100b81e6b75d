"""SASL/PLAIN against SCRAM credentials (broker.server.auth.plain): the password is
checked through the stored salt and keys of either SCRAM mechanism; malformed
messages, another authorization identity, an unknown user and a second message are
refused with the one refusal (or the state error), never an exception of another kind."""

from __future__ import annotations

import pytest

from broker.common.credentials import ScramCredential, ScramSettings
from broker.common.errors import IllegalSaslState, SaslAuthenticationFailed
from broker.server.auth.plain import PlainExchange
from broker.server.auth.sasl import REFUSED, decoy

SETTINGS = ScramSettings(4096, b"s" * 32)
STORED = {("alice", "SCRAM-SHA-256"): ScramCredential.derive("SCRAM-SHA-256", "alice-secret", 4096),
          ("bob", "SCRAM-SHA-512"): ScramCredential.derive("SCRAM-SHA-512", "bob-secret", 4096)}


def lookup(user: str, mechanism: str) -> ScramCredential:
    return STORED.get((user, mechanism)) or decoy(SETTINGS, user, mechanism)


@pytest.mark.parametrize("message, principal", [
    (b"\0alice\0alice-secret", "User:alice"),
    (b"alice\0alice\0alice-secret", "User:alice"),  # authzid: the same user
    (b"\0bob\0bob-secret", "User:bob"),  # stored for SCRAM-SHA-512 only
])
def test_a_right_password_authenticates(message, principal):
    assert PlainExchange(lookup).step(message) == (b"", principal)


@pytest.mark.parametrize("message", [
    b"\0alice\0wrong", b"\0alice\0bob-secret", b"\0nobody\0alice-secret", b"bob\0alice\0alice-secret",
    b"alice-secret", b"\0alice", b"\0\0alice-secret", b"\0alice\0", b"\0alice\0a\0b", b"\0\xff\0x",
])
def test_anything_else_is_refused_alike(message):
    with pytest.raises(SaslAuthenticationFailed, match=REFUSED):
        PlainExchange(lookup).step(message)


def test_one_message_per_exchange():
    exchange = PlainExchange(lookup)
    exchange.step(b"\0alice\0alice-secret")
    with pytest.raises(IllegalSaslState):
        exchange.step(b"\0alice\0alice-secret")
