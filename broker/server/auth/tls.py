"""TLS for listeners and for the broker's own connections to leaders (Python's `ssl`):
certificates and keys from PEM files, client certificates verified against
`ssl.cafile` when `ssl.client.auth` asks for them, and reloaded when their files change
— the contexts stay the same objects, so new handshakes use the new certificate
while established connections keep theirs."""

from __future__ import annotations

import logging
import os
import ssl

from broker.server.config import BrokerConfig

logger = logging.getLogger(__name__)

ANONYMOUS = "User:ANONYMOUS"


def subject_principal(subject: tuple) -> str:
    """`User:CN=...,O=...` from a certificate subject as `ssl` gives it, written as RFC 4514
    writes a distinguished name: the most specific RDN first, a multi-valued RDN's
    attributes joined by `+`, and each value escaped — so no value can spell other
    attributes (a CN of `alice,OU=payments` is `CN=alice\\,OU=payments`, never the
    subject with that OU)."""
    rdns = ["+".join(f"{_SHORT.get(key, key)}={escape_dn_value(value)}" for key, value in rdn)
            for rdn in reversed(subject)]
    return "User:" + ",".join(rdns) if rdns else ANONYMOUS


_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
          "localityName": "L", "stateOrProvinceName": "ST", "domainComponent": "DC"}
_SPECIAL = frozenset('"+,;<>\\')


def escape_dn_value(value: str) -> str:
    """An attribute value escaped as RFC 4514, section 2.4, asks: `"+,;<>\\` always, `#`
    or a space first, a space last, NUL as `\\00`."""
    last = len(value) - 1
    return "".join("\\00" if ch == "\0" else
                   "\\" + ch if ch in _SPECIAL or (i == 0 and ch in "# ") or (i == last and ch == " ") else ch
                   for i, ch in enumerate(value))


def certificate_principal(certfile: str) -> str:
    """The principal of our own certificate, as a peer will see it. `ssl` decodes a
    certificate file only through this private helper; it is in CPython since 3.4."""
    return subject_principal(ssl._ssl._test_decode_cert(certfile)["subject"])  # type: ignore[attr-defined]


class ReloadingContexts:
    """The broker's server and client TLS contexts, and the files they came from."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server.minimum_version = ssl.TLSVersion.TLSv1_2
        self.server.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                                   "required": ssl.CERT_REQUIRED}[config.ssl_client_auth]
        self.client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.client.minimum_version = ssl.TLSVersion.TLSv1_2
        self.client.check_hostname = False  # brokers are verified by CA and, on REPLICA_FETCH, by principal
        self._stamp: tuple = ()
        self.load()

    def _files(self) -> list[str]:
        return [f for f in (self.config.ssl_certfile, self.config.ssl_keyfile, self.config.ssl_cafile) if f]

    def _mtimes(self) -> tuple:
        return tuple(os.stat(f).st_mtime_ns for f in self._files())

    def load(self) -> None:
        stamp = self._mtimes()
        for context in (self.server, self.client):
            context.load_cert_chain(self.config.ssl_certfile, self.config.ssl_keyfile)
            if self.config.ssl_cafile:
                context.load_verify_locations(self.config.ssl_cafile)
        self._stamp = stamp

    def reload_if_changed(self) -> bool:
        """Load the files again if any changed; a bad new file is logged and the old
        certificate kept, never a broker that cannot accept connections."""
        try:
            if self._mtimes() == self._stamp:
                return False
            self.load()
        except (OSError, ssl.SSLError) as exc:
            logger.error("TLS files changed but cannot be loaded (%s); keeping the previous certificate", exc)
            return False
        logger.info("TLS certificate and keys reloaded from %s", ", ".join(self._files()))
        return True
