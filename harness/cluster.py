"""Broker processes for tests, the demo and the benchmarks: `logbus-broker` started
from the running environment, each on a free port of 127.0.0.1, sharing one ZooKeeper
connect string (a single server or an ensemble, `harness.zookeeper`).

Settings are passed as `--set key=value`, except passwords (`SECRET_KEYS`): those go to
a properties file only this user may read, passed with `--config`, since every local
user can read a command line.

A broker is ready once its registration node (`/brokers/ids/<id>`) exists in ZooKeeper
with its port, created after this start: a node that lingers from a killed previous
run (until ZooKeeper expires its session) is older than the process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from broker.common.zklayout import broker_path
from broker.server.config import SECRET_KEYS
from harness.process import ClusterError, free_port, stop_process, tail, unwind_on_sigterm, wait_until
from harness.zookeeper import ZooKeeperServer


def broker_command() -> list[str]:
    """`logbus-broker` from the running environment (the venv's script beside python)."""
    script = Path(sys.executable).parent / "logbus-broker"
    return [str(script)] if script.exists() else [sys.executable, "-m", "broker.tools.cli"]


class BrokerProcess:
    """One `logbus-broker` process. `settings` are passed as `--set key=value`, passwords
    in a file of mode 0600."""

    def __init__(
        self, broker_id: int, zookeeper: str, workdir: Path, port: int | None = None,
        settings: dict[str, object] | None = None, preamble: str | None = None,
        broker_zookeeper: str | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.zookeeper = zookeeper  # where the harness watches for the registration
        self.broker_zookeeper = broker_zookeeper or zookeeper  # where the broker connects (e.g. ZooKeeper's TLS port)
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.settings = dict(settings or {})
        # Python run inside the broker before it starts: a test's fault-injection hook
        # (tests/replication/faults.py), never a stand-in for the broker's own code
        self.preamble = preamble
        self.log_dir = self.workdir / f"broker-{broker_id}" / "logs"
        self.log_path = self.workdir / f"broker-{broker_id}" / "broker.log"
        self.secrets_path = self.workdir / f"broker-{broker_id}" / "secrets.properties"
        self.process: subprocess.Popen | None = None
        self._started_ms = 0

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def kafka_bootstrap(self) -> str:
        """`host:port` of its Kafka listener, for Kafka clients' `bootstrap.servers`."""
        listeners = str(self.settings.get("listeners", ""))
        for endpoint in listeners.split(","):
            if endpoint.startswith("KAFKA://"):
                return endpoint.removeprefix("KAFKA://")
        raise ValueError(f"broker {self.broker_id} has no KAFKA listener (listeners={listeners!r})")

    def command(self) -> list[str]:
        start = broker_command() if self.preamble is None else [
            sys.executable, "-c", f"{self.preamble}\nfrom broker.tools.cli import broker_main\nraise SystemExit(broker_main())"]
        cmd = start + [
            "--broker-id", str(self.broker_id), "--host", "127.0.0.1", "--port", str(self.port),
            "--zookeeper", self.broker_zookeeper,
        ]
        if "log.dirs" not in self.settings:
            cmd += ["--log-dir", str(self.log_dir)]
        if SECRET_KEYS & self.settings.keys():
            cmd += ["--config", str(self.secrets_path)]
        for key, value in self.settings.items():
            if key not in SECRET_KEYS:
                cmd += ["--set", f"{key}={value}"]
        return cmd

    def _write_secrets(self) -> None:
        secrets = "".join(f"{key}={value}\n" for key, value in self.settings.items() if key in SECRET_KEYS)
        if secrets:
            with open(os.open(self.secrets_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
                file.write(secrets)

    def start(self, wait: bool = True, timeout: float = 60) -> "BrokerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._write_secrets()
        self._started_ms = int(time.time() * 1000)
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0  # this run's lines follow
        unwind_on_sigterm()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        """Wait until the broker has registered itself in ZooKeeper (it listens before
        it registers) and finished starting (its controller, timers): a SIGTERM before
        that aborts the start instead of shutting down cleanly."""
        zk = KazooClient(self.zookeeper)
        try:
            zk.start(timeout)
        except KazooTimeoutError:
            raise ClusterError(f"broker {self.broker_id}: ZooKeeper at {self.zookeeper} is unreachable") from None
        try:
            wait_until(lambda: self._registered(zk), timeout, f"broker {self.broker_id} to register")
            wait_until(self._serving, timeout, f"broker {self.broker_id} to finish starting")
        except TimeoutError:
            raise ClusterError(f"broker {self.broker_id} did not register:\n{self.log_tail()}") from None
        finally:
            zk.stop()
            zk.close()

    def _serving(self) -> bool:
        if self.process.poll() is not None:
            raise ClusterError(f"broker {self.broker_id} exited with {self.process.returncode}:\n{self.log_tail()}")
        return self.logged_since(self._log_start, f"] broker {self.broker_id} serving on ")

    def _registered(self, zk: KazooClient) -> bool:
        if self.process.poll() is not None:
            raise ClusterError(f"broker {self.broker_id} exited with {self.process.returncode}:\n{self.log_tail()}")
        try:
            data, stat = zk.get(broker_path(self.broker_id))
        except NoNodeError:
            return False
        return stat.ctime >= self._started_ms and json.loads(data)["port"] == self.port  # not a killed run's node

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def logged_since(self, offset: int, text: str) -> bool:
        """Whether `text` is in what the broker logged after byte `offset` of its log."""
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return text.encode() in log.read()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM: a clean shutdown (flush, clean-shutdown marker)."""
        code = stop_process(self.process, signal.SIGTERM, timeout)
        return code

    def kill(self) -> None:
        """SIGKILL: a crash; the next start recovers the logs."""
        stop_process(self.process, signal.SIGKILL, 10)

    def pause(self) -> None:
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)


class LocalCluster:
    """Brokers sharing one ZooKeeper connect string; stops them all on exit."""

    def __init__(self, zookeeper: str, workdir: Path, settings: dict[str, object] | None = None,
                 broker_zookeeper: str | None = None) -> None:
        self.zookeeper = zookeeper
        self.broker_zookeeper = broker_zookeeper
        self.workdir = Path(workdir)
        self.settings = dict(settings or {})
        self.brokers: dict[int, BrokerProcess] = {}

    def start_broker(self, broker_id: int, settings: dict[str, object] | None = None, wait: bool = True,
                     preamble: str | None = None, zookeeper: str | None = None,
                     port: int | None = None, kafka: bool = False) -> BrokerProcess:
        """Start (or restart) a broker. `zookeeper` overrides the cluster's connect string
        for this broker alone (e.g. through a `harness.proxy.TcpProxy` a test can cut).
        `kafka`: a Kafka listener too, at `broker.kafka_port` (docs/kafka.md)."""
        existing = self.brokers.get(broker_id)
        if existing is not None:  # a restart keeps the ports and the log directory
            existing.settings = {**existing.settings, **(settings or {})}
            return existing.start(wait=wait)
        if kafka:
            port = port or free_port()
            settings = {"listeners": f"PLAINTEXT://127.0.0.1:{port},KAFKA://127.0.0.1:{free_port()}",
                        **(settings or {})}
        broker = BrokerProcess(broker_id, zookeeper or self.zookeeper, self.workdir, port,
                               settings={**self.settings, **(settings or {})},
                               preamble=preamble, broker_zookeeper=None if zookeeper else self.broker_zookeeper)
        self.brokers[broker_id] = broker
        return broker.start(wait=wait)

    def kill_all(self) -> None:
        """SIGKILL every broker at once, then wait for them: killed one by one, the
        survivors' controller would react to the first deaths before the last."""
        running = [b for b in self.brokers.values() if b.alive]
        for broker in running:
            try:
                os.killpg(broker.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for broker in running:
            broker.kill()  # reaps it (and is a no-op for one already gone)

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


@contextlib.contextmanager
def scratch_cluster(prefix: str, settings: dict[str, object] | None = None
                    ) -> Iterator[tuple[ZooKeeperServer, LocalCluster]]:
    """A ZooKeeper server and a `LocalCluster` (no broker started yet) in a temporary
    directory, removed once both are stopped: a benchmark's logs run to gigabytes, and
    left behind they fill the disk run after run."""
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        work = Path(scratch)
        with ZooKeeperServer(work / "zookeeper") as zookeeper, \
                LocalCluster(zookeeper.connect_string, work, settings=settings) as cluster:
            yield zookeeper, cluster
