"""`make demo` as a person runs it, for one hour of events (the demo's full code path:
ZooKeeper, a live cluster in each of two datacenters, the mirror, two offline brokers, the
simulator, `airflow dags test` of the example hourly DAG into
Iceberg, the audit and the table's description): its output has no Python warnings and
no epoch numbers, its topic is replicated on both brokers, and the load's task log
carries neither PySpark's pandas warning nor the JVM's incubator-module notice.
About a minute on 2 idle cores."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# the demo's own deadline (`demo` below) comes first, so that a slow or stuck run shows
# where it was; pytest-timeout's default (300 s) cut it once with nothing to read
DEMO_DEADLINE_S = 600
pytestmark = [pytest.mark.slow, pytest.mark.timeout(DEMO_DEADLINE_S + 240)]
ROOT = Path(__file__).resolve().parents[2]
PYTHON_WARNING = re.compile(r"\b\w*Warning\b|warnings\.warn")
TEN_YEARS_S = 10 * 365 * 86400


def epoch_numbers(text: str) -> list[str]:
    """Integers in `text` that read as a time within ten years of now, in epoch seconds
    or milliseconds: what a person would have to convert to know the time."""
    now = time.time()
    found = []
    for number in re.findall(r"(?<![\d.])\d{10}(?:\d{3})?(?![\d.])", text):
        seconds = int(number) / (1000 if len(number) == 13 else 1)
        if abs(seconds - now) < TEN_YEARS_S:
            found.append(number)
    return found


def test_epoch_numbers_are_told_from_ids_offsets_and_iso_times():
    assert epoch_numbers("complete through: 1795485600000; since 1795485600") == ["1795485600000", "1795485600"]
    assert epoch_numbers("snapshot 3670337667291827106: batch 20261124T010000_20261124T020000, ranges p0[0,39862), "
                         "complete through: 2026-11-24T02:00Z, 0.1795485600000") == []


def tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(none)"


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One run of the demo (its own ZooKeeper, brokers and Airflow home under a scratch
    directory). On a timeout it gets SIGINT, which stops what it started."""
    work = tmp_path_factory.mktemp("demo")
    # a person's shell, not this worker's: other provider tests set LOGBUS_* and AIRFLOW_*
    # for their DAGs in this process (a declared schema of their own, say), and the demo
    # reads the examples' configuration from the environment
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOGBUS_", "AIRFLOW_"))}
    process = subprocess.Popen([sys.executable, "demo/run_demo.py", "--hours", "1", "--rate", "100", "--servers", "2",
                                "--keep", str(work)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True, env=env)
    try:
        output, _ = process.communicate(timeout=DEMO_DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=120)
        logs = "".join(f"\n---- {name}, last lines ----\n{tail(work / name)}" for name in ("airflow.log", "mirror.log"))
        pytest.fail(f"the demo did not finish within {DEMO_DEADLINE_S} s:\n{output[-5000:]}{logs}")
    return subprocess.CompletedProcess(process.args, process.returncode, output), work


def test_the_demo_loads_every_message_exactly_once(demo):
    run, _ = demo
    assert run.returncode == 0, run.stdout[-5000:]
    assert "RESULT: every produced message is in the table exactly once" in run.stdout


def test_the_demos_output_has_no_python_warnings_and_no_epoch_numbers(demo):
    run, _ = demo
    assert not [line for line in run.stdout.splitlines() if PYTHON_WARNING.search(line)], run.stdout
    assert not epoch_numbers(run.stdout), run.stdout
    assert re.search(r"complete through: \d{4}-\d\d-\d\dT\d\d:\d\dZ", run.stdout), run.stdout


def test_the_demos_topic_is_replicated_on_both_brokers(demo):
    run, _ = demo
    assert "topic web_activity: 4 partitions, replication factor 2 on brokers 0, 1" in run.stdout, run.stdout


def test_the_load_task_log_has_no_pyspark_or_jvm_noise(demo):
    _, work = demo
    log = (work / "airflow.log").read_text(errors="replace")
    assert "SparkContext: Running Spark version" in log  # spark-submit's output is there...
    assert "FutureWarning" not in log and "pandas >= 3.0.0" not in log  # ...without PySpark's pandas warning
    assert "jdk.incubator.vector" not in log


def test_the_demo_audits_every_tier_through_a_stalled_broker_and_a_killed_mirror(demo):
    """Issue 23's pipeline: web servers in two live datacenters, the east broker paused past
    the producers' timeout, the mirror killed once — and the audit still finds every
    message once at every tier."""
    run, _ = demo
    out = run.stdout
    assert "east broker paused" in out and "the mirror was killed with SIGKILL and restarted" in out, out
    assert "(tiers: producer -> mirror -> broker -> table)" in out, out
    total = next(line for line in out.splitlines() if line.startswith("total"))
    produced, mirrored, committed, loaded, rejected, missing, duplicated = map(int, total.split()[1:8])
    assert produced == mirrored == committed == loaded + rejected > 0 and missing == duplicated == 0, total
    assert re.search(r"mirrored per source: east \d+, west \d+", out), out
