"""The authentication handshake (docs/protocol.md, "Authentication"; Kafka's
SaslHandshake and SaslAuthenticate, KIP-43 and KIP-152): on a listener that
authenticates, a connection's first requests pick a SASL mechanism and then carry that
mechanism's messages, opaque to the protocol, until the broker accepts or refuses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from broker.common.protocol.primitives import ApiKey, Reader, Writer

MAX_SASL_BYTES = 64 * 1024  # a SCRAM message is a few hundred bytes


@dataclass(frozen=True)
class SaslHandshakeRequest:
    API: ClassVar[ApiKey] = ApiKey.SASL_HANDSHAKE
    mechanism: str

    def encode(self) -> bytes:
        return bytes(Writer().string(self.mechanism).buf)

    @classmethod
    def decode(cls, r: Reader) -> "SaslHandshakeRequest":
        mechanism = r.string()
        r.done()
        return cls(mechanism)


@dataclass(frozen=True)
class SaslHandshakeResponse:
    """The mechanisms this listener accepts (also the body of an UnsupportedSaslMechanism
    refusal's text, so a client can say what it could have used)."""

    mechanisms: list[str]

    def encode(self) -> bytes:
        w = Writer().int32(len(self.mechanisms))
        for mechanism in self.mechanisms:
            w.string(mechanism)
        return bytes(w.buf)

    @classmethod
    def decode(cls, r: Reader) -> "SaslHandshakeResponse":
        return cls([r.string() for _ in range(r.count(100))])


@dataclass(frozen=True)
class SaslAuthenticateRequest:
    API: ClassVar[ApiKey] = ApiKey.SASL_AUTHENTICATE
    auth_bytes: bytes

    def encode(self) -> bytes:
        return bytes(Writer().sized(self.auth_bytes).buf)

    @classmethod
    def decode(cls, r: Reader) -> "SaslAuthenticateRequest":
        n = r.count(MAX_SASL_BYTES)
        data = bytes(r.raw(n))
        r.done()
        return cls(data)


@dataclass(frozen=True)
class SaslAuthenticateResponse:
    auth_bytes: bytes

    def encode(self) -> bytes:
        return bytes(Writer().sized(self.auth_bytes).buf)

    @classmethod
    def decode(cls, r: Reader) -> "SaslAuthenticateResponse":
        return cls(bytes(r.raw(r.count(MAX_SASL_BYTES))))
