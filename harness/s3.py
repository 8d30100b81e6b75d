"""A private S3 API server for tests: moto's standalone server (`moto_server`, from the
`moto[server]` package on PyPI, as the s3fs project tests itself) speaking S3 over HTTP
on 127.0.0.1 and a free port, its state in memory, always stopped by `stop()`.

Clients reach it as any S3: endpoint `http://127.0.0.1:<port>`, any access key and
secret (moto accepts every signature), region us-east-1. `create_bucket` makes a bucket
through pyarrow, as the product would see it.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from harness.process import ClusterError, free_port, stop_process, tail, wait_until

logger = logging.getLogger(__name__)

ACCESS_KEY = "logbus-test-access-key"
SECRET_KEY = "logbus-test-secret-8c1f4e2a9b"  # a string no log line should ever hold
REGION = "us-east-1"


def moto_server_command() -> list[str]:
    """This interpreter's `moto_server` (the pinned one), else the first on PATH."""
    beside = Path(sys.executable).parent / "moto_server"
    found = str(beside) if beside.exists() else shutil.which("moto_server")
    if not found:
        raise ClusterError("the S3 test server needs moto[server] (pip install 'moto[server]'); the test extra "
                           "installs it")
    return [found]


class S3Server:
    """`S3Server(workdir).start()`; `endpoint`, `properties()` (pyiceberg's `s3.*`),
    `create_bucket(name)`. The server's output goes to `workdir/moto.log`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.port = free_port()
        self.host = "127.0.0.1"
        self.log_path = self.workdir / "moto.log"
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def properties(self) -> dict[str, str]:
        return {"s3.endpoint": self.endpoint, "s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY,
                "s3.region": REGION}

    def start(self) -> "S3Server":
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen([*moto_server_command(), "-H", self.host, "-p", str(self.port)],
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        finally:
            log.close()
        try:
            wait_until(self._accepting, 30, f"moto S3 server on port {self.port}")
        except Exception:
            self.stop()
            raise ClusterError(f"moto S3 server did not start:\n{tail(self.log_path)}") from None
        return self

    def _accepting(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise ClusterError(f"moto S3 server exited with {self.process.returncode}:\n{tail(self.log_path)}")
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def create_bucket(self, name: str) -> str:
        from pyarrow.fs import S3FileSystem

        fs = S3FileSystem(endpoint_override=f"{self.host}:{self.port}", scheme="http", access_key=ACCESS_KEY,
                          secret_key=SECRET_KEY, region=REGION, allow_bucket_creation=True)
        fs.create_dir(name)
        return f"s3://{name}"

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, signal.SIGTERM, 10)
            self.process = None

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
