"""What every harness server shares: free ports on 127.0.0.1, polling until a condition
holds, a log's tail for error messages, a process's CPU time, and stopping a process group."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable


class ClusterError(RuntimeError):
    """A local process did not start or stop as expected; the message says where its log is."""


def _ephemeral_ports() -> tuple[int, int]:
    """The range the kernel gives outgoing connections their local ports from."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


_handed_out: set[int] = set()  # ports this process chose: a server may be down for a restart on one


def _port_range() -> range:
    """Ports outside the kernel's ephemeral range, and under pytest-xdist a slice of
    them for this worker (its subprocesses inherit the variables): two workers, or a
    worker and a benchmark it runs, must not choose a port for servers started
    seconds apart (seen: a broker failing to bind, EADDRINUSE)."""
    low, _ = _ephemeral_ports()
    ports = range(10_000, low) if low > 11_000 else range(1024, low)
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker.startswith("gw") and worker[2:].isdigit() and count > 1:
        size = len(ports) // count
        index = int(worker[2:]) % count
        return ports[index * size:(index + 1) * size]
    return ports


def free_port() -> int:
    """A port free on 127.0.0.1 now, never chosen before by this process, and outside
    the kernel's ephemeral range: servers are started seconds after their ports are
    chosen (a cluster's brokers one after another), and a port from that range could
    meanwhile become the local port of any outgoing connection on the machine."""
    candidates = _port_range()
    for _ in range(200):
        port = random.choice(candidates)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # a crowded range: fall back to the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used so far, every thread (Linux
    /proc): a server's side of a benchmark."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: stat's fields 14, 15


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


def unwind_on_sigterm() -> None:
    """Called as a server starts: from then on SIGTERM (a `kill`, a runner's timeout)
    raises SystemExit in the main thread, so the `finally` blocks and context managers
    that stop the servers run. By default the signal ended Python at once, and the
    servers, in sessions of their own, ran on: two killed benchmarks left four. A handler
    someone installed (bench.paper's) is kept, and so is the default in other threads."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_unwinding)


def _exit_unwinding(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)


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
