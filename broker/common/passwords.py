"""A password checked against the cluster's SCRAM credentials (`broker.common.credentials`):
what SASL/PLAIN on the Kafka listener and HTTP Basic on the schema registry share.

No password is stored, only each user's salted SCRAM keys, so a password is salted
and hashed as SCRAM would with the stored salt and count, and the stored key it gives
compared in constant time with the stored one. A user matches through either SCRAM
mechanism it has. Nothing tells an unknown user from a known one: an unknown name
meets decoy credentials — a salt of the same length, the same for that name on every
node (a keyed hash under the cluster's secret), the cluster's count — the same work
and the same refusal."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
from typing import Callable

from kazoo.client import KazooClient
from scramp import ScramException, ScramMechanism

from broker.common.credentials import MECHANISMS, ScramCredential, ScramSettings, cluster_settings, read_credential

logger = logging.getLogger(__name__)

Lookup = Callable[[str, str], ScramCredential]  # (user, mechanism) -> the user's credential, or a decoy


def decoy(settings: ScramSettings, user: str, mechanism: str) -> ScramCredential:
    """A credential no password matches, shown for a user that does not exist: its salt
    is as long as a real one, the same for that name and mechanism wherever and whenever
    it is asked, and unpredictable without the cluster's secret; its count the cluster's."""
    salt = hmac.new(settings.secret, f"{mechanism}:{user}".encode(), hashlib.sha256).digest()
    return ScramCredential(salt, os.urandom(32), os.urandom(32), settings.iterations)


def password_matches(lookup: Lookup, user: str, password: str) -> bool:
    """Whether `password` is `user`'s through any SCRAM mechanism. Every mechanism is
    tried whatever matches: the same work for every name. Blocking (reads ZooKeeper,
    derives keys)."""
    matched = False
    for mechanism in MECHANISMS:
        credential = lookup(user, mechanism)
        try:
            _, stored_key, _, _ = ScramMechanism(mechanism).make_auth_info(password, credential.iterations,
                                                                           salt=credential.salt)
        except ScramException:  # a password SASLprep refuses
            continue
        matched |= hmac.compare_digest(stored_key, credential.stored_key)
    return matched


class ClusterCredentials:
    """The users' credentials as ZooKeeper holds them, read at each check (a changed
    password holds at once), and the cluster's SCRAM settings, read (or made) once."""

    def __init__(self, zk: KazooClient, acl=None) -> None:
        self.zk, self._acl = zk, acl
        self._settings: ScramSettings | None = None
        self._settings_lock = threading.Lock()
        self._odd_counts: set[str] = set()  # users already warned about

    def settings(self) -> ScramSettings:
        with self._settings_lock:
            if self._settings is None:
                self._settings = cluster_settings(self.zk, self._acl)
            return self._settings

    def lookup(self, user: str, mechanism: str) -> ScramCredential:
        """The user's credential for `mechanism`, or a decoy."""
        settings = self.settings()
        credential = read_credential(self.zk, user, mechanism)
        if credential is None:
            return decoy(settings, user, mechanism)
        if credential.iterations != settings.iterations and user not in self._odd_counts:
            self._odd_counts.add(user)
            logger.warning("user %r is stored with %d iterations, not the cluster's %d: that tells it from unknown "
                           "users; set its password again (logbus users add)", user, credential.iterations,
                           settings.iterations)
        return credential
