"""What every peer server shares: a process in its own session, in a scratch
directory, on free loopback ports, stopped (TERM, then KILL) however the run ends.

A peer is installed from Debian's packages when missing (`ensure_debian_packages`),
started for the duration of the benchmark only, and never through systemd.
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

from harness.process import free_port, tail, wait_until  # noqa: F401 (re-exported to the peers)

logger = logging.getLogger(__name__)


class PeerError(RuntimeError):
    """A peer did not install, start or stop; the message says where its log is."""


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk under `path` (like `du -s --block-size=1`): sparse and
    preallocated-but-unwritten space does not count."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass  # deleted while we walked
    return total


def disk_listing(path: Path) -> str:
    """Bytes on disk per file under `path`, biggest first: where a system's overhead is."""
    rows = []
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            rows.append((st.st_blocks * 512, st.st_size, os.path.relpath(full, path)))
    rows.sort(reverse=True)
    return "\n".join(f"{used:>14,} on disk {size:>14,} apparent  {name}" for used, size, name in rows)


def settled_disk_bytes(path: Path, timeout: float = 30.0, interval: float = 1.0) -> int:
    """`disk_bytes` once two readings `interval` apart agree (the server has written
    what it buffered), or the last reading after `timeout`."""
    os.sync()
    last = disk_bytes(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(interval)
        os.sync()
        now = disk_bytes(path)
        if now == last:
            return now
        last = now
    return last


def ensure_debian_packages(packages: list[str], present: Callable[[], bool]) -> None:
    """`apt-get install` the packages unless `present()` already says they are there."""
    if present():
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    print(f"installing Debian packages: {' '.join(packages)}", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(sudo + ["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    if not present():
        raise PeerError(f"installed {packages} but the programs are still missing")


class PeerServer:
    """One server process. Subclasses set `name`, build `command()`/`environment()`,
    and say when the server is `ready()`."""

    name = "peer"

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir) / self.name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "server.log"
        self.process: subprocess.Popen | None = None

    # subclasses
    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def ready(self) -> bool:
        raise NotImplementedError

    def data_dir(self) -> Path:
        """The directory whose growth is the storage the messages take."""
        raise NotImplementedError

    def after_stop(self) -> None:
        """Clean up helpers the server started (e.g. Erlang's epmd)."""

    # lifecycle
    def start(self, timeout: float = 120) -> "PeerServer":
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), env=self.environment(), cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )

        def up() -> bool:
            if self.process.poll() is not None:
                raise PeerError(f"{self.name} exited with {self.process.returncode}; log {self.log_path}:\n"
                                f"{tail(self.log_path)}")
            return self.ready()

        try:
            wait_until(up, timeout, f"{self.name} to start", 0.25)
        except TimeoutError:
            self.stop()
            raise PeerError(f"{self.name} did not start in {timeout:.0f}s; log {self.log_path}:\n"
                            f"{tail(self.log_path)}") from None
        return self

    def stop(self, timeout: float = 30) -> None:
        process, self.process = self.process, None
        try:
            if process is not None and process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    logger.warning("%s ignored SIGTERM for %.0fs; killing it", self.name, timeout)
                    try:
                        os.killpg(process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    process.wait(10)
        finally:
            self.after_stop()

    def remove_data(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "PeerServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
