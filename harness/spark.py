"""Spark for tests and benchmarks.

`local_session()`: a `local[*]` SparkSession whose JVM has exited when the block ends.

`SparkStandalone`: a Spark standalone cluster for tests, one master and one worker run
from the pip `pyspark`'s own launcher (`bin/spark-class`; the wheel has no `sbin/start-master.sh`),
each in the foreground in its own process group, so `stop()` ends the daemon and the
executors it launched even when a test fails.

Everything listens on 127.0.0.1 (`--host`, and `SPARK_LOCAL_IP` for the web UIs and the
executors), on free ports; the master's REST submission server (a fixed port, 6066) is
off. The worker's environment is what executors inherit: give it the Python the job
runs with (`PYSPARK_PYTHON`) and what makes the provider importable there
(`PYTHONPATH`, standing in for the provider installed on the worker machines).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from harness.process import ClusterError, free_port, stop_process, tail, wait_until

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOOPBACK = "127.0.0.1"
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """The pip `pyspark` package directory: it holds `bin/`, `jars/` and Spark's scripts."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ClusterError("a Spark standalone cluster needs the pyspark package")
    return Path(spec.origin).parent


@contextlib.contextmanager
def local_session(master: str = "local[*]", conf: dict[str, str] | None = None) -> Iterator[SparkSession]:
    """A SparkSession on `master` (UTC, no UI or progress bars, loopback; `conf` adds settings), its
    Python workers on this interpreter. On the way out the session is stopped and its
    JVM too, waited for: pyspark leaves the JVM to notice on its own that the Python
    process has ended, so a benchmark's JVM — and the scratch directories its shutdown
    removes — would outlive the benchmark."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", LOOPBACK)
               .config("spark.driver.bindAddress", LOOPBACK))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        spark.sparkContext.setLogLevel("ERROR")
        yield spark
    finally:
        gateway = SparkContext._gateway
        spark.stop()
        if gateway is not None:
            gateway.shutdown()
            SparkContext._gateway = SparkContext._jvm = None
            jvm = getattr(gateway, "proc", None)
            if jvm is not None:
                jvm.stdin.close()  # the JVM exits, running its shutdown hooks, on EOF of its stdin
                try:
                    jvm.wait(30)
                except subprocess.TimeoutExpired:
                    jvm.kill()
                    jvm.wait(10)


class SparkStandalone:
    """`SparkStandalone(workdir, env={...}).start()`; submit to `master_url`. Logs:
    `master.log`, `worker.log`; each executor's `stderr` is under `work/<app-id>/<executor-id>/`."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None, cores: int = 2, memory: str = "1g") -> None:
        self.workdir = Path(workdir)
        self.env, self.cores, self.memory = dict(env or {}), cores, memory
        self.port, self.worker_port = free_port(), free_port()
        self.webui_port, self.worker_webui_port = free_port(), free_port()
        self.work_dir = self.workdir / "work"
        self.master: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    @property
    def master_log(self) -> Path:
        return self.workdir / "master.log"

    @property
    def worker_log(self) -> Path:
        return self.workdir / "worker.log"

    def executor_logs(self) -> list[Path]:
        """The `stderr` of every executor the worker has launched."""
        return sorted(self.work_dir.glob("app-*/*/stderr"))

    def _environment(self) -> dict[str, str]:
        conf_dir = self.workdir / "conf"  # empty: no spark-env.sh or spark-defaults.conf from elsewhere
        conf_dir.mkdir(parents=True, exist_ok=True)
        return {**os.environ, **self.env, "SPARK_HOME": str(spark_home()), "SPARK_CONF_DIR": str(conf_dir),
                "SPARK_LOCAL_IP": LOOPBACK, "SPARK_DAEMON_MEMORY": "256m",
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}

    def _launch(self, log: Path, main: str, *args: str) -> subprocess.Popen:
        with open(log, "ab") as out:
            return subprocess.Popen([str(spark_home() / "bin" / "spark-class"), main, *args], env=self._environment(),
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=self.workdir, start_new_session=True)

    def _wait_for(self, process: subprocess.Popen, log: Path, line: str, what: str, timeout: float) -> None:
        def logged() -> bool:
            if process.poll() is not None:
                raise ClusterError(f"{what} exited with {process.returncode}; its log {log}:\n{tail(log)}")
            return log.exists() and line in log.read_text(errors="replace")

        try:
            wait_until(logged, timeout, what, 0.2)
        except TimeoutError:
            raise ClusterError(f"{what} did not start within {timeout:.0f}s; its log {log}:\n{tail(log)}") from None

    def start(self, timeout: float = 60) -> "SparkStandalone":
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.master = self._launch(self.master_log, MASTER, "--host", LOOPBACK, "--port", str(self.port),
                                       "--webui-port", str(self.webui_port))
            self._wait_for(self.master, self.master_log, "New state: ALIVE", "the Spark master", timeout)
            self.worker = self._launch(self.worker_log, WORKER, "--host", LOOPBACK, "--port", str(self.worker_port),
                                       "--webui-port", str(self.worker_webui_port), "--cores", str(self.cores),
                                       "--memory", self.memory, "--work-dir", str(self.work_dir), self.master_url)
            self._wait_for(self.worker, self.worker_log, "Successfully registered with master", "the Spark worker",
                           timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM to each daemon's process group (the worker's holds its executors),
        SIGKILL after 15 s; the worker first, so it does not look for a new master."""
        for process in (self.worker, self.master):
            stop_process(process, signal.SIGTERM, 15)
        self.worker = self.master = None

    def __enter__(self) -> "SparkStandalone":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
