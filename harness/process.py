"""What every harness server shares: free ports on 127.0.0.1, polling until a condition
holds, a log's tail for error messages, and stopping a process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable


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


def stop_process(process: subprocess.Popen | None, sig: int, timeout: float) -> int | None:
    """Send `sig` to a process started with `start_new_session=True` (its whole group),
    SIGKILL it if it has not exited after `timeout`; its exit code."""
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
