"""SCRAM credentials in ZooKeeper (docs/operations.md, "Securing a cluster"; RFC 5802 and
RFC 7677, Kafka's KIP-84): what `logbus users` writes and brokers read at each
handshake, so a password change holds for every new connection at once.

A user's node holds, per mechanism, the salt, the iteration count and the two keys
derived from the password — never the password: the stored key verifies a client's
proof and cannot be used as one, the server key proves the broker knows it. A node
is readable only by brokers on a cluster with ZooKeeper ACLs (`zookeeper.set.acl`),
since the keys allow an offline guess of a weak password.

The folder `/logbus_users` holds the cluster's SCRAM settings (`ScramSettings`): the
iteration count every user is stored with, and the secret from which brokers derive
the salt they show for a user that does not exist — so that no broker's answer tells
an unknown user from a known one (docs/operations.md, "Securing a cluster")."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from urllib.parse import quote

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from scramp import ScramMechanism

from broker.common.zklayout import USERS

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_ITERATIONS = 8192  # a new cluster's count; RFC 7677 asks for at least 4096, Kafka's default is 4096
SALT_BYTES = 32  # every salt, a user's or one shown for an unknown name: a length would tell them apart


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def derive(cls, mechanism: str, password: str, iterations: int) -> "ScramCredential":
        salt, stored_key, server_key, count = ScramMechanism(mechanism).make_auth_info(
            password, iterations, salt=os.urandom(SALT_BYTES))
        return cls(salt, stored_key, server_key, count)

    def as_tuple(self) -> tuple[bytes, bytes, bytes, int]:
        """In the order scramp's server asks for them."""
        return self.salt, self.stored_key, self.server_key, self.iterations


@dataclass(frozen=True)
class ScramSettings:
    """The cluster's SCRAM settings, the data of `/logbus_users`: made once, by whichever
    broker or `logbus users` needs them first, and the same for every broker after."""

    iterations: int  # every user's credentials are derived with this count
    secret: bytes  # keys the salts shown for unknown users; readable only by the cluster's identity

    def encode(self) -> bytes:
        return json.dumps({"iterations": self.iterations, "secret": _b64(self.secret)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "ScramSettings":
        settings = json.loads(data)
        return cls(int(settings["iterations"]), base64.b64decode(settings["secret"]))


def cluster_settings(zk: KazooClient, acl=None) -> ScramSettings:
    """The cluster's SCRAM settings, made on first use (compare-and-set on the folder's
    version: of two that race, one writes and both return its value). With `acl` (the
    private ACL of `zookeeper.set.acl`) the folder is readable only by the cluster's
    identity — its secret, and the list of users, are not for anyone who reaches
    ZooKeeper; a folder made open before is closed."""
    zk.ensure_path(USERS, acl=acl)
    if acl and zk.get_acls(USERS)[0] != acl:
        zk.set_acls(USERS, acl)
    while True:
        data, stat = zk.get(USERS)
        if data:
            return ScramSettings.decode(data)
        made = ScramSettings(DEFAULT_ITERATIONS, os.urandom(32))
        try:
            zk.set(USERS, made.encode(), version=stat.version)
            return made
        except BadVersionError:
            continue


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
                 acl=None) -> None:
    """Store a user's salted credentials for `mechanisms` (others the user had stay), with
    the cluster's iteration count: a user stored with another would stand apart from
    the unknown names brokers answer with the cluster's count."""
    check_user_name(user)
    if not password:
        raise ValueError("the password is empty")
    iterations = cluster_settings(zk, acl).iterations
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
