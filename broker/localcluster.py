"""A local cluster for development, tests, the demo and the benchmarks: a real
ZooKeeper server run from the Debian package's jars in a scratch directory, and broker
processes started through the `logbus-broker` command, each on a free port.

Nothing here is used by a production broker; it only starts and stops real processes.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

logger = logging.getLogger(__name__)

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
ZOOKEEPER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"


class ClusterError(RuntimeError):
    """A local process did not start or stop as expected; the message says where its log is."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> object:
    """Poll `condition` until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a process's log file, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ZooKeeperServer:
    """A standalone ZooKeeper on 127.0.0.1. `tick_ms` sets the smallest session timeout
    (2 ticks), which tests keep short to expire sessions quickly."""

    def __init__(self, workdir: Path, port: int | None = None, tick_ms: int = 500) -> None:
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.tick_ms = tick_ms
        self.process: subprocess.Popen | None = None
        self.log_path = self.workdir / "zookeeper.log"

    @property
    def connect_string(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> "ZooKeeperServer":
        java = shutil.which("java")
        if java is None or not ZOOKEEPER_JAR.exists():
            raise ClusterError(
                "ZooKeeper needs Java and Debian's zookeeper package (apt-get install zookeeper); "
                "`make test` and `make demo` install it"
            )
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        config = self.workdir / "zoo.cfg"
        config.write_text(
            f"tickTime={self.tick_ms}\ndataDir={self.workdir / 'data'}\nclientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\n"
            "4lw.commands.whitelist=*\n"
        )
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [java, "-Xmx256m", "-cp", f"{ZOOKEEPER_JAR}:{self.workdir}",
                 "-Dzookeeper.4lw.commands.whitelist=*", ZOOKEEPER_MAIN, str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        try:
            wait_until(self._ok, timeout, f"ZooKeeper on port {self.port}", 0.1)
        except TimeoutError:
            self.stop()
            raise ClusterError(f"ZooKeeper did not start; its log {self.log_path}:\n{tail(self.log_path)}") from None
        return self

    def _ok(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise ClusterError(f"ZooKeeper exited with {self.process.returncode}:\n{tail(self.log_path)}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"ruok")
                return s.recv(4) == b"imok"
        except OSError:
            return False

    def stop(self) -> None:
        _stop_process(self.process, signal.SIGTERM, 10)
        self.process = None

    def __enter__(self) -> "ZooKeeperServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _stop_process(process: subprocess.Popen | None, sig: int, timeout: float) -> int | None:
    if process is None or process.poll() is not None:
        return None if process is None else process.returncode
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait(10)


def broker_command() -> list[str]:
    """`logbus-broker` from the running environment (the venv's script beside python)."""
    script = Path(sys.executable).parent / "logbus-broker"
    return [str(script)] if script.exists() else [sys.executable, "-m", "broker.cli"]


class BrokerProcess:
    """One `logbus-broker` process. `settings` are passed as `--set key=value`."""

    def __init__(
        self, broker_id: int, zookeeper: str, workdir: Path, port: int | None = None,
        settings: dict[str, object] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.zookeeper = zookeeper
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.settings = dict(settings or {})
        self.log_dir = self.workdir / f"broker-{broker_id}" / "logs"
        self.log_path = self.workdir / f"broker-{broker_id}" / "broker.log"
        self.process: subprocess.Popen | None = None
        self._log_start = 0

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def command(self) -> list[str]:
        cmd = broker_command() + [
            "--broker-id", str(self.broker_id), "--host", "127.0.0.1", "--port", str(self.port),
            "--zookeeper", self.zookeeper,
        ]
        if "log.dirs" not in self.settings:
            cmd += ["--log-dir", str(self.log_dir)]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def start(self, wait: bool = True, timeout: float = 60) -> "BrokerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        """Wait until the broker has registered itself (it listens before it registers)."""

        def registered() -> bool:
            if self.process.poll() is not None:
                raise ClusterError(f"broker {self.broker_id} exited with {self.process.returncode}:\n{self.log_tail()}")
            with open(self.log_path, "rb") as log:  # only this run's lines
                log.seek(self._log_start)
                return b"registered broker" in log.read()

        try:
            wait_until(registered, timeout, f"broker {self.broker_id} to register")
        except TimeoutError:
            raise ClusterError(f"broker {self.broker_id} did not register:\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM: a clean shutdown (flush, clean-shutdown marker)."""
        code = _stop_process(self.process, signal.SIGTERM, timeout)
        return code

    def kill(self) -> None:
        """SIGKILL: a crash; the next start recovers the logs."""
        _stop_process(self.process, signal.SIGKILL, 10)

    def pause(self) -> None:
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)


class LocalCluster:
    """Brokers sharing one ZooKeeper connect string; stops them all on exit."""

    def __init__(self, zookeeper: str, workdir: Path, settings: dict[str, object] | None = None) -> None:
        self.zookeeper = zookeeper
        self.workdir = Path(workdir)
        self.settings = dict(settings or {})
        self.brokers: dict[int, BrokerProcess] = {}

    def start_broker(self, broker_id: int, settings: dict[str, object] | None = None, wait: bool = True) -> BrokerProcess:
        existing = self.brokers.get(broker_id)
        if existing is not None:  # a restart keeps the port and the log directory
            existing.settings = {**existing.settings, **(settings or {})}
            return existing.start(wait=wait)
        broker = BrokerProcess(broker_id, self.zookeeper, self.workdir, settings={**self.settings, **(settings or {})})
        self.brokers[broker_id] = broker
        return broker.start(wait=wait)

    def start(self, count: int) -> "LocalCluster":
        for broker_id in range(count):
            self.start_broker(broker_id)
        return self

    def stop(self) -> None:
        for broker in self.brokers.values():
            try:
                broker.stop()
            except Exception:
                broker.kill()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
