"""The load job's local log file (`airflow_provider_logbus.operators.sparklog`): a task
process killed with SIGKILL leaves it behind (its `finally` never runs); the next load
on the host removes it, and never a file a running load holds."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from airflow_provider_logbus.operators.sparklog import MIN_AGE_S, remove_abandoned, spark_log_file

ROOT = Path(__file__).resolve().parents[2]
# a task process in the middle of a load: it prints its log's path, then waits for a line
# on stdin ("kill": SIGKILL itself inside the load; anything else: finish the load)
LOAD = """
import os, signal, sys
from airflow_provider_logbus.operators.sparklog import spark_log_file
with spark_log_file("20261128T100000_20261128T110000.1") as log:
    print(log, flush=True)
    if sys.stdin.readline().strip() == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def tmp_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def loading(tmp_dir: Path) -> tuple[subprocess.Popen, Path]:
    process = subprocess.Popen([sys.executable, "-c", LOAD], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "TMPDIR": str(tmp_dir), "PYTHONPATH": str(ROOT)})
    return process, Path(process.stdout.readline().strip())


def age(path: Path) -> None:
    old = time.time() - 2 * MIN_AGE_S
    os.utime(path, (old, old))


def test_a_log_left_by_a_killed_task_is_removed_by_the_next_load(tmp_dir):
    process, log = loading(tmp_dir)
    process.communicate("kill\n", timeout=30)
    assert process.returncode == -9 and log.exists()  # what SIGKILL left behind
    age(log)
    with spark_log_file("next") as mine:
        assert not log.exists()
        assert mine.exists()
    assert list(tmp_dir.iterdir()) == []


def test_a_running_loads_log_is_never_removed_and_goes_when_its_load_ends(tmp_dir):
    process, log = loading(tmp_dir)
    try:
        age(log)  # a long load whose job has written nothing for a while
        assert remove_abandoned() == []
        assert log.exists()
    finally:
        process.communicate("done\n", timeout=30)
    assert process.returncode == 0 and not log.exists()


def test_a_new_unlocked_log_is_left_alone(tmp_dir):
    """Between its creation and its lock a file is unlocked: young files are not touched."""
    young = tmp_dir / "logbus-spark-young-x.log"
    young.write_text("")
    other = tmp_dir / "someone-else.log"
    other.write_text("")
    age(other)
    assert remove_abandoned() == []
    assert young.exists() and other.exists()
