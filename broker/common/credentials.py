"""SCRAM credentials in ZooKeeper (docs/operations.md, "Securing a cluster"; RFC 5802 and
RFC 7677, Kafka's KIP-84): what `logbus users` writes and brokers read at each
handshake, so a password change holds for every new connection at once.

A user's node holds, per mechanism, the salt, the iteration count and the two keys
derived from the password — never the password: the stored key verifies a client's
proof and cannot be used as one, the server key proves the broker knows it. A node
is readable only by brokers on a cluster with ZooKeeper ACLs (`zookeeper.set.acl`),
since the keys allow an offline guess of a weak password."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from urllib.parse import quote

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from scramp import ScramMechanism

from broker.common.zklayout import USERS

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_ITERATIONS = 8192  # RFC 7677 asks for at least 4096; Kafka's default is 4096


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def derive(cls, mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> "ScramCredential":
        salt, stored_key, server_key, count = ScramMechanism(mechanism).make_auth_info(password, iterations)
        return cls(salt, stored_key, server_key, count)

    def as_tuple(self) -> tuple[bytes, bytes, bytes, int]:
        """In the order scramp's server asks for them."""
        return self.salt, self.stored_key, self.server_key, self.iterations


def user_path(user: str) -> str:
    return f"{USERS}/{quote(user, safe='')}"


def check_user_name(user: str) -> str:
    if not user or len(user) > 255 or any(ch in user for ch in ",=") or not user.isprintable():
        raise ValueError(f"invalid user name {user!r}: 1-255 printable characters, no ',' or '='")
    return user


def encode_credentials(credentials: dict[str, ScramCredential]) -> bytes:
    return json.dumps({m: {"salt": _b64(c.salt), "stored_key": _b64(c.stored_key),
                           "server_key": _b64(c.server_key), "iterations": c.iterations}
                       for m, c in credentials.items()}, sort_keys=True).encode()


def decode_credentials(data: bytes) -> dict[str, ScramCredential]:
    return {m: ScramCredential(base64.b64decode(c["salt"]), base64.b64decode(c["stored_key"]),
                               base64.b64decode(c["server_key"]), int(c["iterations"]))
            for m, c in json.loads(data).items()}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def read_credential(zk: KazooClient, user: str, mechanism: str) -> ScramCredential | None:
    try:
        data, _ = zk.get(user_path(user))
    except NoNodeError:
        return None
    return decode_credentials(data).get(mechanism)


def set_password(zk: KazooClient, user: str, password: str, mechanisms: tuple[str, ...] = MECHANISMS,
                 iterations: int = DEFAULT_ITERATIONS, acl=None) -> None:
    """Store a user's salted credentials for `mechanisms` (others the user had stay)."""
    check_user_name(user)
    if not password:
        raise ValueError("the password is empty")
    fresh = {m: ScramCredential.derive(m, password, iterations) for m in mechanisms}
    path = user_path(user)
    while True:
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            try:
                zk.create(path, encode_credentials(fresh), acl=acl, makepath=True)
                return
            except NodeExistsError:
                continue
        try:
            zk.set(path, encode_credentials({**decode_credentials(data), **fresh}), version=stat.version)
            return
        except (BadVersionError, NoNodeError):
            continue


def delete_user(zk: KazooClient, user: str) -> bool:
    try:
        zk.delete(user_path(user))
        return True
    except NoNodeError:
        return False


def list_users(zk: KazooClient) -> dict[str, list[str]]:
    """Users and their mechanisms (never their keys)."""
    users = {}
    try:
        children = zk.get_children(USERS)
    except NoNodeError:
        return {}
    for child in sorted(children):
        try:
            data, _ = zk.get(f"{USERS}/{child}")
            users[child] = sorted(decode_credentials(data))
        except (NoNodeError, ValueError, KeyError):
            continue
    return users
