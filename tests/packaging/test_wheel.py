"""The wheel as a user installs it, at the lowest and the highest Airflow the provider
claims (`apache-airflow>=3.2.0,<4`).

Lowest: `.venv-min/` holds Airflow 3.2.0 with every direct dependency at the floor
pyproject.toml declares ("lowest direct": `>=X` becomes `==X`), created once and reused
while pyproject's dependencies and the Python version stay the same (a stamp file keys
it; a lock keeps concurrent test runs from building it twice). Each run builds the wheel
(`pip wheel --no-deps .`) and reinstalls it there without dependencies, so only the
package is fresh. Highest: the project's own `.venv` (the newest 3.x release).

The cold build downloads Airflow and its dependencies (pyspark from pip's cache when
there) and takes a few minutes; warm runs take well under a minute.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ reads pyproject.toml without a dependency

ROOT = Path(__file__).resolve().parents[2]
MIN_VENV = ROOT / ".venv-min"
EXAMPLE_DAGS = {"logbus_hourly_load", "logbus_daily_audit", "logbus_complete_hours", "logbus_table_maintenance"}

pytestmark = pytest.mark.slow

PARSE = """
import json, sys
try:
    from airflow.dag_processing.dagbag import DagBag
except ImportError:
    from airflow.models.dagbag import DagBag
import airflow
bag = DagBag(sys.argv[1])  # examples stay off: AIRFLOW__CORE__LOAD_EXAMPLES=False
print(json.dumps({"airflow": airflow.__version__, "dags": sorted(bag.dag_ids),
                  "errors": {k: str(v) for k, v in bag.import_errors.items()}}))
"""


def lowest_constraints() -> list[str]:
    """`name==floor` for every runtime dependency of the provider (core + `airflow` extra)."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = []
    for text in project["dependencies"] + project["optional-dependencies"]["airflow"]:
        req = Requirement(text)
        floors = [s.version for s in req.specifier if s.operator in (">=", "==")]
        assert floors, f"{text}: a dependency needs a floor (>=) to be tested at"
        out.append(f"{req.name}=={floors[0]}")
    return sorted(out)


def run(cmd: list[str], env: dict | None = None, timeout: float = 600) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(out)])
    (built,) = out.glob("logbus-*.whl")
    return built


@pytest.fixture(scope="module")
def min_venv(wheel) -> Path:
    """`.venv-min/` at the floors, with this wheel installed."""
    constraints = lowest_constraints()
    stamp = hashlib.sha256(json.dumps([sys.version_info[:2], constraints]).encode()).hexdigest()[:16]
    python = MIN_VENV / "bin" / "python"
    with open(ROOT / ".venv-min.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp_file = MIN_VENV / ".stamp"
        if not stamp_file.exists() or stamp_file.read_text() != stamp:
            shutil.rmtree(MIN_VENV, ignore_errors=True)
            run([sys.executable, "-m", "venv", str(MIN_VENV)])
            (MIN_VENV / "constraints.txt").write_text("\n".join(constraints) + "\n")
            run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"])
            run([str(python), "-m", "pip", "install", "-q", "-c", str(MIN_VENV / "constraints.txt"),
                 f"logbus[airflow] @ {wheel.as_uri()}"], timeout=3000)
            stamp_file.write_text(stamp)
        run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)])
    return MIN_VENV


def airflow_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHONPATH", "LOGBUS"))}
    env.update({"AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow' / 'airflow.db'}"})
    return env


def test_wheel_carries_the_examples_and_the_broker_properties(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (*(f"{d}.py" for d in EXAMPLE_DAGS), "simulate_web_servers.py", "broker.properties", "__main__.py"):
        assert f"airflow_provider_logbus/examples/{name}" in names


def test_wheel_carries_the_pages_assets_and_registers_its_plugin(wheel):
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    for name in ("page.html", "logbus.js", "logbus.css"):  # built by hand: no build step at install
        assert f"airflow_provider_logbus/ui/static/{name}" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "[airflow.plugins]\nlogbus = airflow_provider_logbus.ui.plugin:LogbusPlugin" in archive.read(
        entry_points).decode()


def test_wheel_leaves_the_test_and_demo_harness_out(wheel):
    """harness/ (ZooKeeper, brokers, PostgreSQL, Airflow for tests, demo and bench) stays in the checkout."""
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist() if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"broker", "airflow_provider_logbus"}


@pytest.mark.long  # builds .venv-min/ on a fresh machine: 1.5 min of CI's 20 (README, "Development")
@pytest.mark.timeout(3600)
def test_lowest_airflow_lists_the_provider(min_venv, tmp_path):
    env = airflow_env(tmp_path)
    assert run([str(min_venv / "bin" / "airflow"), "version"], env).strip() == "3.2.0"
    assert "logbus" in run([str(min_venv / "bin" / "airflow"), "providers", "list"], env)
    plugins = json.loads(run([str(min_venv / "bin" / "airflow"), "plugins", "--output", "json"], env))
    [page] = [p for p in plugins if p["name"] == "logbus"]  # installing the wheel is enough for the Logbus page
    assert "logbus" in str(page["fastapi_apps"]) and "Logbus" in str(page["external_views"])


def parse_examples(python: Path, tmp_path: Path) -> dict:
    """Copy the examples with the documented command (cwd outside the checkout, so the
    installed package is the one used) and parse the DAG folder as Airflow does."""
    dags = tmp_path / "dags"
    env = airflow_env(tmp_path)
    run([str(python), "-m", "airflow_provider_logbus.examples", str(dags)], env)
    proc = subprocess.run([str(python), "-c", PARSE, str(dags)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_examples_parse_on_the_lowest_airflow(min_venv, tmp_path):
    result = parse_examples(min_venv / "bin" / "python", tmp_path)
    assert result["airflow"] == "3.2.0"
    assert result["errors"] == {} and set(result["dags"]) == EXAMPLE_DAGS


def test_examples_parse_on_the_highest_airflow(tmp_path):
    result = parse_examples(Path(sys.executable), tmp_path)
    assert result["airflow"].startswith("3.")
    assert result["errors"] == {} and set(result["dags"]) == EXAMPLE_DAGS
