"""An Airflow 3 deployment owned by a test, deployed as a user would: a metadata database
on PostgreSQL, `airflow db migrate`, then `api-server`, `scheduler` (LocalExecutor),
`dag-processor` and `triggerer` as separate processes, each in its own process group
with its log in the home directory.

Everything listens on 127.0.0.1 only: the API server is bound there (its execution API
is what task runners call), and the scheduler and triggerer run with
`--skip-serve-logs` (their log servers would bind every interface; task logs are read
from files here). Configuration is written to `<home>/airflow.cfg`; inherited
`AIRFLOW__*`, `AIRFLOW_CONN_*` and `LOGBUS_*` variables are dropped so the caller's own
settings (the provider tests' SQLite database, connections and example settings other
tests of the worker left) cannot override it, and the caller's `env` (DAG settings,
`AIRFLOW_CONN_*`) is passed to every process, task runners included.

    deployment = AirflowDeployment(home, postgres.create_database("airflow"), dags, env)
    deployment.start()
    deployment.unpause("my_dag"); deployment.backfill("my_dag", "2024-01-01T00:00", "2024-01-01T03:00")
    runs = deployment.wait_for_runs("my_dag", 5, timeout=600)
    deployment.stop()

Run states are read from the metadata database with plain SQL (an `airflow` CLI call
costs seconds of CPU; polling through it would compete with the tasks).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.process import ClusterError, free_port, tail, wait_until

logger = logging.getLogger(__name__)

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
FINISHED = {"success", "failed"}


@dataclass(frozen=True)
class RunState:
    """One DAG run as the metadata database holds it."""

    run_id: str
    run_type: str  # scheduled, backfill, manual, asset_triggered
    state: str | None
    logical_date: datetime | None
    start_date: datetime | None
    end_date: datetime | None
    backfill_id: int | None


@dataclass(frozen=True)
class TaskState:
    task_id: str
    state: str | None
    try_number: int
    start_date: datetime | None
    end_date: datetime | None


def airflow_executable() -> str:
    return str(Path(sys.executable).parent / "airflow")


class AirflowDeployment:
    """Airflow with its metadata database at `db_url` (SQLAlchemy URL; PostgreSQL),
    DAGs from `dags_folder`, `env` added to every process's environment. `parallelism`
    bounds the LocalExecutor's concurrent tasks (the machine has 2 cores)."""

    def __init__(self, home: Path, db_url: str, dags_folder: Path, env: dict[str, str] | None = None,
                 parallelism: int = 4, users: dict[str, tuple[str, str]] | None = None) -> None:
        self.home = Path(home)
        # username -> (role, password) for the simple auth manager; None: everyone is an
        # admin without logging in
        self.users = users
        self.db_url = db_url
        self.dags_folder = Path(dags_folder)
        self.extra_env = dict(env or {})
        self.parallelism = parallelism
        self.api_port = free_port()
        self.processes: dict[str, subprocess.Popen] = {}
        self._engine = None

    # ------------------------------------------------------------------ configuration

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def settings(self) -> dict[str, dict[str, Any]]:
        """airflow.cfg, by section (the keys are Airflow 3.3's)."""
        return {
            "core": {
                "dags_folder": self.dags_folder,
                "executor": "LocalExecutor",
                "parallelism": self.parallelism,
                "load_examples": False,
                "dags_are_paused_at_creation": True,
                # task runners report to the execution API of our API server
                "execution_api_server_url": f"{self.api_url}/execution/",
                # loopback only and throw-away: no logins, unless the test is about them
                "simple_auth_manager_all_admins": self.users is None,
                **({"simple_auth_manager_users": ",".join(f"{u}:{role}" for u, (role, _) in self.users.items()),
                    "simple_auth_manager_passwords_file": self.home / "passwords.json"} if self.users else {}),
            },
            "database": {"sql_alchemy_conn": self.db_url},
            "api": {
                "host": "127.0.0.1", "port": self.api_port, "base_url": self.api_url, "workers": 1,
                "secret_key": secrets.token_hex(16),
            },
            # one secret for the API server (validates) and the scheduler (signs task tokens)
            "api_auth": {"jwt_secret": secrets.token_hex(32)},
            "logging": {"base_log_folder": self.home / "logs"},
            "scheduler": {"scheduler_idle_sleep_time": 0.5, "job_heartbeat_sec": 2},
            "triggerer": {"job_heartbeat_sec": 2},
            # one parse at start-up is enough (the DAG file does not change during a test)
            "dag_processor": {"parsing_processes": 1, "min_file_process_interval": 600,
                              "refresh_interval": 600, "print_stats_interval": 0},
        }

    def write_config(self) -> Path:
        self.home.mkdir(parents=True, exist_ok=True)
        lines = []
        for section, options in self.settings().items():
            lines.append(f"[{section}]")
            lines += [f"{key} = {value}" for key, value in options.items()]
            lines.append("")
        path = self.home / "airflow.cfg"
        path.write_text("\n".join(lines))
        if self.users:
            (self.home / "passwords.json").write_text(json.dumps({u: pw for u, (_, pw) in self.users.items()}))
        return path

    def token(self, username: str) -> str:
        """A JWT for `username` (one of `users`), from the API server's login endpoint."""
        body = json.dumps({"username": username, "password": self.users[username][1]}).encode()
        request = urllib.request.Request(f"{self.api_url}/auth/token", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)["access_token"]

    def environment(self) -> dict[str, str]:
        """This process's environment less its Airflow settings, connections and LOGBUS_*
        example settings (other tests of the worker set them), plus the deployment's own
        and `extra_env`."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "LOGBUS_")) and k != "AIRFLOW_HOME"}
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.extra_env)
        return env

    # ------------------------------------------------------------------ life cycle

    def start(self, timeout: float = 240) -> "AirflowDeployment":
        """Migrates the database, starts the four components and waits until the API
        server reports each of them healthy."""
        self.write_config()
        try:
            self.cli("db", "migrate", timeout=timeout)
            for name in COMPONENTS:
                self._spawn(name)
            wait_until(self._healthy, timeout, "Airflow's API server, scheduler, dag-processor and triggerer", 1)
        except BaseException:
            self.stop(print_logs=True)
            raise
        logger.info("Airflow up: %s (home %s)", self.api_url, self.home)
        return self

    def _spawn(self, name: str) -> None:
        args = {"scheduler": ["--skip-serve-logs"], "triggerer": ["--skip-serve-logs"],
                "api-server": ["--host", "127.0.0.1", "--port", str(self.api_port)]}.get(name, [])
        with open(self.log_path(name), "ab") as log:
            self.processes[name] = subprocess.Popen(
                [airflow_executable(), name, *args], env=self.environment(), cwd=self.home,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def log_path(self, component: str) -> Path:
        return self.home / f"{component}.log"

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise ClusterError(f"airflow {name} exited with {process.returncode}; log {self.log_path(name)}:\n"
                                   f"{tail(self.log_path(name), 60)}")

    def health(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"{self.api_url}/api/v2/monitor/health", timeout=5) as answer:
                return json.load(answer)
        except (OSError, ValueError):
            return None

    def _healthy(self) -> bool:
        self.check_alive()
        health = self.health()
        return bool(health) and all((health.get(part) or {}).get("status") == "healthy"
                                    for part in ("metadatabase", "scheduler", "triggerer", "dag_processor"))

    def stop(self, timeout: float = 30, print_logs: bool = False) -> None:
        """SIGTERM to every component's process group and to every descendant (task
        runners, spark-submit, their JVMs), SIGKILL to what is left after `timeout`."""
        if print_logs:
            sys.stderr.write(self.log_tails())
        import psutil  # an Airflow dependency

        descendants = self._process_tree()
        for process in self.processes.values():
            if process.poll() is None:
                _signal_group(process.pid, signal.SIGTERM)
        for child in descendants:
            with contextlib.suppress(psutil.Error):
                child.terminate()
        deadline = time.monotonic() + timeout
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
        for process in self.processes.values():
            _signal_group(process.pid, signal.SIGKILL)
            if process.poll() is None:
                process.wait(10)
        _, alive = psutil.wait_procs(descendants, timeout=max(0.1, deadline - time.monotonic()))
        for child in alive:  # psutil checks the pid was not reused
            with contextlib.suppress(psutil.Error):
                child.kill()
        self.processes.clear()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def _process_tree(self) -> list:
        """psutil.Process of every descendant of every component, now."""
        import psutil

        found = []
        for process in self.processes.values():
            with contextlib.suppress(psutil.Error):
                found += psutil.Process(process.pid).children(recursive=True)
        return found

    def __enter__(self) -> "AirflowDeployment":
        return self.start()

    def __exit__(self, exc_type, *exc) -> None:
        self.stop(print_logs=exc_type is not None)

    # ------------------------------------------------------------------ the CLI

    def cli(self, *args: str, timeout: float = 180, check: bool = True) -> subprocess.CompletedProcess:
        """`airflow <args>` with the deployment's configuration; output as text."""
        result = subprocess.run([airflow_executable(), *args], env=self.environment(), cwd=self.home,
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise ClusterError(f"airflow {' '.join(args)} exited with {result.returncode}:\n"
                               f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result

    def unpause(self, dag_id: str) -> None:
        self.cli("dags", "unpause", dag_id)

    def backfill(self, dag_id: str, from_date: str, to_date: str, **options: Any) -> subprocess.CompletedProcess:
        """`airflow backfill create`; `options` become flags (`max_active_runs=2` →
        `--max-active-runs 2`, `run_backwards=True` → `--run-backwards`)."""
        args = ["backfill", "create", "--dag-id", dag_id, "--from-date", from_date, "--to-date", to_date]
        for key, value in options.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value not in (None, False):
                args += [flag, str(value)]
        return self.cli(*args)

    # ------------------------------------------------------------------ the metadata database

    def _query(self, sql: str, **params: Any) -> list:
        from sqlalchemy import create_engine, text

        if self._engine is None:
            self._engine = create_engine(self.db_url, pool_size=1, max_overflow=0)
        with self._engine.connect() as connection:
            return list(connection.execute(text(sql), params))

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        """Until the dag-processor has serialized `dag_id` (before that the CLI cannot see it)."""

        def parsed() -> bool:
            self.check_alive()
            return bool(self._query("SELECT 1 FROM serialized_dag WHERE dag_id = :d", d=dag_id))

        wait_until(parsed, timeout, f"the dag-processor to parse {dag_id}", 0.5)

    def dag_runs(self, dag_id: str) -> list[RunState]:
        rows = self._query("SELECT run_id, run_type, state, logical_date, start_date, end_date, backfill_id "
                           "FROM dag_run WHERE dag_id = :d ORDER BY logical_date", d=dag_id)
        return [RunState(*row) for row in rows]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, TaskState]:
        rows = self._query("SELECT task_id, state, try_number, start_date, end_date FROM task_instance "
                           "WHERE dag_id = :d AND run_id = :r", d=dag_id, r=run_id)
        return {row[0]: TaskState(*row) for row in rows}

    def wait_for_runs(self, dag_id: str, count: int, timeout: float) -> list[RunState]:
        """Until `dag_id` has at least `count` runs and every run has finished; the runs."""

        def finished() -> list[RunState] | None:
            self.check_alive()
            runs = self.dag_runs(dag_id)
            return runs if len(runs) >= count and all(r.state in FINISHED for r in runs) else None

        try:
            return wait_until(finished, timeout, f"{count} finished runs of {dag_id}", 1)
        except TimeoutError:
            states = {r.run_id: (r.state, {t: s.state for t, s in self.task_states(dag_id, r.run_id).items()})
                      for r in self.dag_runs(dag_id)}
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {count} finished runs of {dag_id}: "
                               f"{states}") from None

    # ------------------------------------------------------------------ logs

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int | None = None) -> str:
        """A task attempt's log (the last attempt by default)."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        attempts = sorted(folder.glob("attempt=*.log"), key=lambda p: int(p.stem.split("=")[1]))
        if try_number is not None:
            attempts = [p for p in attempts if p.stem == f"attempt={try_number}"]
        return attempts[-1].read_text(errors="replace") if attempts else f"(no log in {folder})"

    def log_tails(self, lines: int = 40) -> str:
        """The components' last log lines, then those of every failed task attempt."""
        out = [f"\n---- airflow {name} ({self.log_path(name)}) ----\n{tail(self.log_path(name), lines)}"
               for name in COMPONENTS if self.log_path(name).exists()]
        for path in sorted((self.home / "logs").glob("dag_id=*/run_id=*/task_id=*/attempt=*.log")):
            text = path.read_text(errors="replace")
            if '"level":"error"' in text.replace(" ", "") or "Task failed" in text or "ERROR" in text:
                out.append(f"\n---- task log {path.relative_to(self.home)} ----\n"
                           + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(out) + "\n"


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


