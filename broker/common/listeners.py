"""Listeners and their security protocols (docs/operations.md, "Securing a cluster";
Kafka's `listeners`, `advertised.listeners` and `listener.security.protocol.map`, KIP-103).

A broker serves one port per listener; each listener has a name, and its advertised
endpoint — the address clients are told to use — is registered in ZooKeeper beside the
others. Clients pick the listener they reach by name, so one broker can be reached in
clear text on a private network and over TLS from outside, or at a NAT's address."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class SecurityProtocol(str, enum.Enum):
    """What a listener (and a client connecting to it) speaks: TLS or not, and whether
    a SASL handshake must come before any other request."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)

    @classmethod
    def parse(cls, text: str) -> "SecurityProtocol":
        try:
            return cls(text.strip().upper())
        except ValueError:
            raise ValueError(f"unknown security protocol {text!r}: use one of "
                             f"{', '.join(p.value for p in cls)}") from None


_ENDPOINT = re.compile(r"(?P<name>[A-Za-z][A-Za-z0-9_]*)://(?P<host>\[[^\]]*\]|[^:/]*):(?P<port>\d{1,5})")


@dataclass(frozen=True)
class Endpoint:
    """`NAME://host:port`. An empty host (`PLAINTEXT://:9092`) binds every interface."""

    name: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.name}://{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> "Endpoint":
        match = _ENDPOINT.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"listener {text!r} is not NAME://host:port")
        port = int(match["port"])
        if not 0 <= port < 65536:
            raise ValueError(f"listener {text!r}: port must be 0-65535")
        return cls(match["name"].upper(), match["host"].strip("[]"), port)


def parse_endpoints(text: str) -> tuple[Endpoint, ...]:
    """A comma-separated list of endpoints, each listener name once."""
    endpoints = tuple(Endpoint.parse(item) for item in text.split(",") if item.strip())
    names = [e.name for e in endpoints]
    if len(set(names)) != len(names):
        raise ValueError(f"listener names must be unique, got {', '.join(names)}")
    return endpoints


def parse_protocol_map(text: str) -> dict[str, SecurityProtocol]:
    """`NAME:PROTOCOL,...`: the security protocol of each listener name."""
    mapping = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        name, sep, protocol = item.partition(":")
        if not sep:
            raise ValueError(f"expected NAME:PROTOCOL, got {item!r}")
        mapping[name.strip().upper()] = SecurityProtocol.parse(protocol)
    return mapping


DEFAULT_PROTOCOL_MAP = ("PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,"
                        "KAFKA:PLAINTEXT,KAFKA_SSL:SSL,KAFKA_SASL_PLAINTEXT:SASL_PLAINTEXT,KAFKA_SASL_SSL:SASL_SSL")
# listeners that speak Kafka's protocol instead of logbus's (docs/kafka.md, "The listener")
DEFAULT_KAFKA_LISTENERS = "KAFKA,KAFKA_SSL,KAFKA_SASL_PLAINTEXT,KAFKA_SASL_SSL"
