"""ZooKeeper for tests, the demo and the benchmarks, run from Debian's zookeeper jars
(/usr/share/java) on 127.0.0.1: a standalone server, or a three-server ensemble whose
servers can be stopped and restarted one at a time.

A server is serving when its `srvr` four-letter word names a mode (standalone, leader or
follower); a server of an ensemble that has no quorum answers that it is not serving.
`with_chroot` gives a connect string whose chroot exists before anyone connects to it.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Iterator

from kazoo.client import KazooClient

from harness.process import ClusterError, free_port, stop_process, tail, unwind_on_sigterm, wait_until

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


def four_letter_word(port: int, word: bytes, timeout: float = 2) -> str:
    """A four-letter command's answer from the server on `port` ("" when unreachable)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(word)
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


@contextlib.contextmanager
def client(connect: str, timeout: float = 30) -> Iterator[KazooClient]:
    """A started kazoo client, stopped and closed on the way out, also on failure: left
    open, it retries against a stopped server for ever, and a watch it was serving can
    hold up the interpreter's exit (kazoo joins its threads at exit)."""
    zk = KazooClient(connect)
    zk.start(timeout)
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


def with_chroot(connect: str, chroot: str) -> str:
    """`connect` + `chroot` (e.g. "/logbus-demo"), the chroot node created first: a kazoo
    client connecting under a chroot that does not exist warns `No chroot path exists,
    the chroot path should be created before normal use` (and the brokers, clients and
    tests that share the string each would)."""
    with client(connect) as zk:
        zk.ensure_path(chroot)
    return connect + chroot


class ZooKeeperServer:
    """One ZooKeeper server on 127.0.0.1: standalone, or, given `peers` ({server id:
    (peer port, election port)}) and its own `server_id`, a member of an ensemble.
    `tick_ms` sets the smallest session timeout (2 ticks), which tests keep short to
    expire sessions quickly."""

    def __init__(
        self, workdir: Path, port: int | None = None, tick_ms: int = 500,
        server_id: int = 0, peers: dict[int, tuple[int, int]] | None = None,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.port = port or free_port()
        # (a PEM holding the server's key and certificate, the CA's PEM): also serve TLS
        # on `secure_port` (Netty, as ZooKeeper 3.5+ does); the plaintext port stays for
        # the harness's own health checks
        self.tls = tls
        self.secure_port = free_port() if tls else None
        self.tick_ms = tick_ms
        self.server_id = server_id
        self.peers = dict(peers or {})
        self.process: subprocess.Popen | None = None
        self.log_path = self.workdir / "zookeeper.log"

    @property
    def connect_string(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def secure_connect_string(self) -> str:
        return f"127.0.0.1:{self.secure_port}"

    def start(self, timeout: float = 60) -> "ZooKeeperServer":
        self.launch()
        self.wait_serving(timeout)
        return self

    def launch(self) -> None:
        """Start the process without waiting: an ensemble's servers serve only once a
        majority of them runs."""
        java = shutil.which("java")
        if java is None or not ZOOKEEPER_JAR.exists():
            raise ClusterError(
                "ZooKeeper needs Java and Debian's zookeeper package (apt-get install zookeeper); "
                "`make test` and `make demo` install it"
            )
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "zoo.cfg"
        lines = [
            f"tickTime={self.tick_ms}", f"dataDir={data}", f"clientPort={self.port}", "clientPortAddress=127.0.0.1",
            "maxClientCnxns=0", "admin.enableServer=false", "4lw.commands.whitelist=*",
        ]
        classpath = [str(ZOOKEEPER_JAR), str(self.workdir)]
        if self.tls:
            keystore, truststore = self.tls
            lines += [f"secureClientPort={self.secure_port}", "secureClientPortAddress=127.0.0.1",
                      "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                      f"ssl.keyStore.location={keystore}", "ssl.keyStore.type=PEM",
                      f"ssl.trustStore.location={truststore}", "ssl.trustStore.type=PEM", "ssl.clientAuth=none"]
            classpath += [str(p) for p in sorted(Path("/usr/share/java").glob("netty-*[0-9].Final.jar"))]
        main = STANDALONE_MAIN
        if self.peers:
            (data / "myid").write_text(f"{self.server_id}\n")
            lines += ["initLimit=10", "syncLimit=5"]
            lines += [f"server.{i}=127.0.0.1:{peer}:{election}" for i, (peer, election) in sorted(self.peers.items())]
            main = QUORUM_MAIN
        config.write_text("\n".join(lines) + "\n")
        unwind_on_sigterm()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [java, "-Xmx256m", "-cp", ":".join(classpath),
                 "-Dzookeeper.4lw.commands.whitelist=*", main, str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def wait_serving(self, timeout: float = 60) -> None:
        try:
            wait_until(self._serving, timeout, f"ZooKeeper on port {self.port}", 0.1)
        except TimeoutError:
            self.stop()
            raise ClusterError(f"ZooKeeper did not start; its log {self.log_path}:\n{tail(self.log_path)}") from None

    def _serving(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise ClusterError(f"ZooKeeper exited with {self.process.returncode}:\n{tail(self.log_path)}")
        return self.mode is not None

    @property
    def mode(self) -> str | None:
        """"standalone", "leader" or "follower" while serving, else None."""
        for line in four_letter_word(self.port, b"srvr").splitlines():
            if line.startswith("Mode: "):
                return line.removeprefix("Mode: ").strip()
        return None

    def stop(self) -> None:
        stop_process(self.process, signal.SIGTERM, 10)
        self.process = None

    def __enter__(self) -> "ZooKeeperServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ZooKeeperEnsemble:
    """Three (or `size`) ZooKeeper servers on 127.0.0.1, each with its own data directory,
    myid and free client, peer and election ports. It serves while a majority runs;
    `stop_server(i)` / `start_server(i)` take one down and bring it back."""

    def __init__(self, workdir: Path, size: int = 3, tick_ms: int = 500) -> None:
        peers = {i: (free_port(), free_port()) for i in range(1, size + 1)}
        self.servers = [
            ZooKeeperServer(Path(workdir) / f"server-{i}", tick_ms=tick_ms, server_id=i, peers=peers)
            for i in peers
        ]

    @property
    def connect_string(self) -> str:
        return ",".join(server.connect_string for server in self.servers)

    def start(self, timeout: float = 90) -> "ZooKeeperEnsemble":
        try:
            for server in self.servers:
                server.launch()
            for server in self.servers:
                server.wait_serving(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop_server(self, index: int) -> None:
        self.servers[index].stop()

    def start_server(self, index: int, timeout: float = 60) -> None:
        self.servers[index].start(timeout)

    @property
    def leader(self) -> int | None:
        """The index of the server that leads now, if any."""
        for index, server in enumerate(self.servers):
            if server.mode == "leader":
                return index
        return None

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> "ZooKeeperEnsemble":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
