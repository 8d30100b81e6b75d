"""How a client reaches a secured cluster (docs/clients.md, "Security"): which listener,
TLS with the cluster's CA (and a client certificate for mTLS), and SASL/SCRAM
credentials. One `ClientSecurity` is given to a producer, consumer, group, mirror or
the `logbus` command and reaches every connection they open.

Settings can come as Kafka's client property names (`security.protocol`,
`ssl.cafile`, `sasl.username`, ...; `ClientSecurity.from_properties`), which is how
the `logbus` command's `--command-config` file, the Airflow connection's extras and
the Spark data source's options carry them. The password never appears in `repr`."""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import shutil
import socket
import ssl
import tempfile
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Mapping

from scramp import ScramClient, ScramException

from broker.common.errors import SaslAuthenticationFailed
from broker.common.listeners import SecurityProtocol
from broker.common.protocol import Reader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest
from broker.common.zkauth import ZooKeeperAuth

PLAINTEXT = SecurityProtocol.PLAINTEXT
Call = Callable[[object], Reader]  # one request on the connection being set up -> its answer's body

_INLINE_PEM = {"ssl.ca.pem": "ssl.cafile", "ssl.cert.pem": "ssl.certfile", "ssl.private.key": "ssl.keyfile"}
_PROPERTIES = {  # property name -> field
    "security.protocol": "protocol", "listener.name": "listener", "ssl.cafile": "ssl_cafile",
    "ssl.certfile": "ssl_certfile", "ssl.keyfile": "ssl_keyfile",
    "ssl.check.hostname": "ssl_check_hostname", "sasl.mechanism": "sasl_mechanism",
    "sasl.username": "sasl_username", "sasl.password": "sasl_password",
    "zookeeper.ssl.cafile": "zookeeper_ssl_cafile", "zookeeper.ssl.certfile": "zookeeper_ssl_certfile",
    "zookeeper.ssl.keyfile": "zookeeper_ssl_keyfile",
}


@dataclass(frozen=True)
class ClientSecurity:
    protocol: SecurityProtocol = PLAINTEXT
    listener: str | None = None  # the listener to reach, by name (ZooKeeper discovery); None: the registered address
    ssl_cafile: str | None = None  # None: the system's CAs
    ssl_certfile: str | None = None  # a client certificate (mTLS)
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True
    sasl_mechanism: str = "SCRAM-SHA-256"
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    zookeeper_ssl_cafile: str | None = None  # TLS to ZooKeeper (its secureClientPort) when set
    zookeeper_ssl_certfile: str | None = None
    zookeeper_ssl_keyfile: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "protocol", SecurityProtocol.parse(str(getattr(self.protocol, "value", self.protocol))))
        if self.protocol.sasl and not (self.sasl_username and self.sasl_password):
            raise ValueError(f"security protocol {self.protocol.value} needs sasl.username and sasl.password")
        if self.sasl_mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise ValueError(f"sasl.mechanism {self.sasl_mechanism!r}: use SCRAM-SHA-256 or SCRAM-SHA-512")
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "zookeeper_ssl_cafile", "zookeeper_ssl_certfile",
                     "zookeeper_ssl_keyfile"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                shown = next(k for k, v in _PROPERTIES.items() if v == name)
                raise ValueError(f"{shown}={path!r}: no such file")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ValueError("ssl.certfile and ssl.keyfile go together")

    @classmethod
    def from_properties(cls, properties: Mapping[str, object]) -> "ClientSecurity":
        """From Kafka-style client property names; unknown names are refused by name.
        PEM text given inline (`ssl.ca.pem`, `ssl.cert.pem`, `ssl.private.key`: an Airflow
        connection's fields, a Spark executor's options) is written to files only this
        process's user can read and that do not outlive it (`_pem_path`), since `ssl`
        loads certificates from files."""
        properties = _materialize_pem(properties)
        unknown = sorted(set(properties) - set(_PROPERTIES))
        if unknown:
            raise ValueError(f"unknown security setting(s) {', '.join(unknown)}; known: {', '.join(_PROPERTIES)}")
        values = {_PROPERTIES[k]: v for k, v in properties.items() if v not in (None, "")}
        if "ssl_check_hostname" in values and isinstance(values["ssl_check_hostname"], str):
            values["ssl_check_hostname"] = values["ssl_check_hostname"].strip().lower() in ("true", "1", "yes")
        return cls(**values)

    def properties(self) -> dict[str, str]:
        """The inverse of `from_properties` (for a Spark option map or a file)."""
        out = {}
        for name, field_name in _PROPERTIES.items():
            value = getattr(self, field_name)
            if value not in (None, "") and value != next(f.default for f in fields(self) if f.name == field_name):
                out[name] = str(getattr(value, "value", value)).lower() if isinstance(value, bool) else \
                    str(getattr(value, "value", value))
        return out

    def zookeeper(self) -> ZooKeeperAuth:
        """How this client reaches ZooKeeper (TLS or not; clients carry no digest)."""
        return ZooKeeperAuth(tls_cafile=self.zookeeper_ssl_cafile or "",
                             tls_certfile=self.zookeeper_ssl_certfile or "",
                             tls_keyfile=self.zookeeper_ssl_keyfile or "")

    @property
    def is_plaintext(self) -> bool:
        return self.protocol == PLAINTEXT and self.listener is None

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ssl_cafile)
        context.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        return context

    def wrap(self, sock: socket.socket, host: str) -> socket.socket:
        """The socket after the TLS handshake, or as it is without TLS."""
        if not self.protocol.tls:
            return sock
        return self._context.wrap_socket(sock, server_hostname=host)

    @property
    def _context(self) -> ssl.SSLContext:
        context = self.__dict__.get("_ssl")
        if context is None:  # one context per settings: it caches sessions and the CA store
            context = self.ssl_context()
            object.__setattr__(self, "_ssl", context)
        return context

    def authenticate(self, call: Call) -> None:
        """The SCRAM exchange on a new connection (nothing without SASL)."""
        if not self.protocol.sasl:
            return
        call(SaslHandshakeRequest(self.sasl_mechanism))
        client = ScramClient([self.sasl_mechanism], self.sasl_username, self.sasl_password)
        try:
            first = call(SaslAuthenticateRequest(client.get_client_first().encode()))
            client.set_server_first(SaslAuthenticateResponse.decode(first).auth_bytes.decode())
            final = call(SaslAuthenticateRequest(client.get_client_final().encode()))
            client.set_server_final(SaslAuthenticateResponse.decode(final).auth_bytes.decode())
        except ScramException as exc:  # the broker's proof is wrong: not the broker we trust
            raise SaslAuthenticationFailed(f"the broker failed to prove it knows the credentials: {exc}") from None


OPEN = ClientSecurity()  # plaintext, no authentication: the default

_pem_paths: dict[str, str] = {}  # sha256 of a PEM text -> the path this process reads it at
_pem_lock = threading.Lock()


def _pem_path(data: bytes) -> str:
    """A path to `data` that only this process's user can read and that nothing leaves
    behind. On Linux an anonymous memory file (memfd), read at /proc/self/fd/N, is gone
    with the process however it ends. A file in a temporary directory was removed by
    `atexit` only: Airflow's task processes end with `os._exit`, and every secured task
    left its client key in /tmp. Elsewhere a private temporary directory, removed at exit."""
    digest = hashlib.sha256(data).hexdigest()
    with _pem_lock:
        path = _pem_paths.get(digest)
        if path is None:
            path = _pem_paths[digest] = _memory_file(digest, data) or _private_file(digest, data)
        return path


def _memory_file(digest: str, data: bytes) -> str | None:
    """`data` in a memfd (Linux), or None where there is none (another OS, a sandbox
    that refuses the call)."""
    try:
        fd = os.memfd_create(f"logbus-pem-{digest[:16]}", os.MFD_CLOEXEC)  # a fork keeps it, an exec does not
    except (AttributeError, OSError):
        return None
    os.fchmod(fd, 0o600)
    with os.fdopen(os.dup(fd), "wb") as file:
        file.write(data)
    return f"/proc/self/fd/{fd}"


def _private_file(digest: str, data: bytes) -> str:
    """`data` in a file of this process's private temporary directory."""
    path = os.path.join(_private_directory(), f"{digest[:16]}.pem")
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
        file.write(data)
    return path


@functools.cache
def _private_directory() -> str:
    """One 0700 temporary directory a process, removed at a normal exit of that process:
    a forked child inherits the atexit handler (and this cache) and must leave it."""
    directory, owner = tempfile.mkdtemp(prefix="logbus-tls-"), os.getpid()

    def remove() -> None:
        if os.getpid() == owner:
            shutil.rmtree(directory, True)

    atexit.register(remove)
    return directory


def _materialize_pem(properties: Mapping[str, object]) -> dict[str, object]:
    inline = {k: v for k, v in properties.items() if k in _INLINE_PEM and v}
    out = {k: v for k, v in properties.items() if k not in _INLINE_PEM}
    if not inline:
        return out
    for key, text in inline.items():
        path = _pem_path(str(text).encode())
        if out.get(_INLINE_PEM[key]):
            raise ValueError(f"give {key} or {_INLINE_PEM[key]}, not both")
        out[_INLINE_PEM[key]] = str(path)
    return out
