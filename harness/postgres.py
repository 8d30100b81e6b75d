"""A private PostgreSQL server for tests: Debian's `postgresql` binaries, a fresh cluster
in a temporary directory, listening on 127.0.0.1 on a free port, trust authentication,
always removed on `stop()`.

initdb and postgres refuse to run as root, so when this process is root the server runs
as the `postgres` system user (the Debian package creates it): every command is started
with that user's uid/gid (what `runuser -u postgres --` does, without an intermediate
process between us and the postmaster, so signals reach it directly). The cluster
directory is then created under the system temp directory, which that user can reach (a
pytest `tmp_path` lives under a root-only 0700 directory), and chowned to it. The unix
socket lives in the cluster directory too (short path: a socket path is limited to 107
bytes), never in /var/run/postgresql.
"""

from __future__ import annotations

import glob
import logging
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from harness.process import ClusterError, free_port, tail, wait_until

logger = logging.getLogger(__name__)

SUPERUSER = "postgres"
SERVER_USER = "postgres"  # the system user Debian's package creates; used when we are root


def postgres_bin_dir() -> Path:
    """`/usr/lib/postgresql/<version>/bin` of the newest installed version."""
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if not found:
        raise ClusterError("PostgreSQL needs Debian's postgresql package (apt-get install postgresql); "
                           "`make system-deps` installs it")

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", Path(path).parent.parent.name))

    return Path(max(found, key=version)).parent


class PostgresServer:
    """`PostgresServer(workdir).start()`; `url("airflow")` for SQLAlchemy, `dsn(...)` for
    libpq. `workdir` keeps the server's log (`postgres.log`); the cluster itself is a
    fresh temporary directory removed by `stop()`."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.log_path = self.workdir / "postgres.log"
        self.bin_dir: Path | None = None
        self.cluster_dir: Path | None = None
        self.process: subprocess.Popen | None = None

    # ------------------------------------------------------------------ addresses

    def dsn(self, database: str = "postgres") -> str:
        return f"host={self.host} port={self.port} user={SUPERUSER} dbname={database}"

    def url(self, database: str = "postgres", driver: str | None = "psycopg2") -> str:
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://{SUPERUSER}@{self.host}:{self.port}/{database}"

    # ------------------------------------------------------------------ life cycle

    def _as_server_user(self) -> dict:
        """Popen arguments that run a command as the server's user (only when we are root)."""
        if os.geteuid() != 0:
            return {}
        user = pwd.getpwnam(SERVER_USER)
        return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}

    def _run(self, *args: str) -> None:
        with open(self.log_path, "ab") as log:
            result = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=self.cluster_dir, **self._as_server_user())
        if result.returncode != 0:
            raise ClusterError(f"{Path(args[0]).name} exited with {result.returncode}; "
                               f"log {self.log_path}:\n{tail(self.log_path)}")

    def start(self, timeout: float = 60) -> "PostgresServer":
        self.bin_dir = postgres_bin_dir()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cluster_dir = Path(tempfile.mkdtemp(prefix="logbus-pg-"))
        try:
            if os.geteuid() == 0:
                user = pwd.getpwnam(SERVER_USER)
                os.chown(self.cluster_dir, user.pw_uid, user.pw_gid)
            data = self.cluster_dir / "data"
            self._run(str(self.bin_dir / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust",
                      "-E", "UTF8", "--no-locale", "--no-sync")
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    [str(self.bin_dir / "postgres"), "-D", str(data), "-p", str(self.port),
                     "-c", f"listen_addresses={self.host}", "-c", f"unix_socket_directories={self.cluster_dir}",
                     "-c", "max_connections=200", "-c", "fsync=off", "-c", "synchronous_commit=off",
                     "-c", "full_page_writes=off"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.cluster_dir,
                    start_new_session=True, **self._as_server_user(),
                )
            wait_until(self._ready, timeout, f"PostgreSQL on port {self.port}", 0.1)
        except BaseException as exc:
            self.stop()
            if isinstance(exc, TimeoutError):
                raise ClusterError(f"PostgreSQL did not start; log {self.log_path}:\n{tail(self.log_path)}") from None
            raise
        logger.info("PostgreSQL %s on %s:%d (cluster %s)", self.bin_dir.parent.name, self.host, self.port,
                    self.cluster_dir)
        return self

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise ClusterError(f"postgres exited with {self.process.returncode}:\n{tail(self.log_path)}")
        return subprocess.run([str(self.bin_dir / "pg_isready"), "-q", "-h", self.host, "-p", str(self.port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0

    def create_database(self, name: str) -> str:
        """Creates `name` (owned by the superuser); returns its SQLAlchemy URL."""
        self._run(str(self.bin_dir / "createdb"), "-h", self.host, "-p", str(self.port), "-U", SUPERUSER, name)
        return self.url(name)

    def stop(self, timeout: float = 30) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, disconnect clients), SIGKILL
        after `timeout`; then removes the cluster directory."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGINT)
                process.wait(timeout)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        if self.cluster_dir is not None:
            shutil.rmtree(self.cluster_dir, ignore_errors=True)
            self.cluster_dir = None

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
