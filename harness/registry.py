"""Schema registry processes for tests (docs/schemas.md): `logbus schema-registry`
started from the running environment on a free port of 127.0.0.1, its state in the
ZooKeeper of the connect string it is given. The cluster's ZooKeeper identity, when
there is one, goes in a `--command-config` file only this user may read.

A registry is ready once it has logged that it serves: it binds and listens before it
logs that line, so connections made after it are accepted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.process import ClusterError, free_port, stop_process, tail, wait_until

READY = "schema registry serving "


def logbus_command() -> list[str]:
    """`logbus` from the running environment (the venv's script beside python)."""
    script = Path(sys.executable).parent / "logbus"
    return [str(script)] if script.exists() else [
        sys.executable, "-c", "from broker.tools.cli import main; raise SystemExit(main())"]


class RegistryProcess:
    """One `logbus schema-registry`. `tls`: (certfile, keyfile) to serve HTTPS;
    `basic_auth`: HTTP Basic against the cluster's users, and ACLs; `zookeeper_auth`:
    the cluster's ZooKeeper identity (user:password)."""

    def __init__(self, zookeeper: str, workdir: Path, name: str = "registry", tls: tuple[str, str] | None = None,
                 basic_auth: bool = False, super_users: tuple[str, ...] = (), zookeeper_auth: str = "",
                 max_body_bytes: int | None = None) -> None:
        self.zookeeper, self.workdir, self.name = zookeeper, Path(workdir) / name, name
        self.tls, self.basic_auth, self.super_users = tls, basic_auth, super_users
        self.zookeeper_auth, self.max_body_bytes = zookeeper_auth, max_body_bytes
        self.port = free_port()
        self.log_path = self.workdir / "registry.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = logbus_command() + ["--zookeeper", self.zookeeper, "--log-level", "INFO"]
        if self.zookeeper_auth:
            config = self.workdir / "command.properties"
            with open(os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
                file.write(f"zookeeper.auth={self.zookeeper_auth}\nzookeeper.set.acl=true\n")
            cmd += ["--command-config", str(config)]
        cmd += ["schema-registry", "--listen", f"127.0.0.1:{self.port}"]
        if self.tls:
            cmd += ["--tls-certfile", str(self.tls[0]), "--tls-keyfile", str(self.tls[1])]
        if self.basic_auth:
            cmd += ["--authenticate", "basic"]
        for user in self.super_users:
            cmd += ["--super-user", user]
        if self.max_body_bytes is not None:
            cmd += ["--max-body-bytes", str(self.max_body_bytes)]
        return cmd

    def start(self, timeout: float = 60) -> "RegistryProcess":
        self.workdir.mkdir(parents=True, exist_ok=True)
        mark = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_until(lambda: self._ready(mark), timeout, f"schema registry {self.name} to serve")
        except TimeoutError:
            self.stop()
            raise ClusterError(f"schema registry {self.name} did not start:\n{tail(self.log_path)}") from None
        return self

    def _ready(self, mark: int) -> bool:
        if self.process.poll() is not None:
            raise ClusterError(f"schema registry {self.name} exited with {self.process.returncode}:\n"
                               f"{tail(self.log_path)}")
        with open(self.log_path, "rb") as log:
            log.seek(mark)
            return READY.encode() in log.read()

    def kill(self) -> None:
        """SIGKILL: no goodbye, as a crashed host."""
        stop_process(self.process, signal.SIGKILL, 10)

    def stop(self) -> None:
        stop_process(self.process, signal.SIGTERM, 10)

    def log_tail(self) -> str:
        return tail(self.log_path)
