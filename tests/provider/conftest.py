"""Fixtures for the provider: Airflow with a temporary AIRFLOW_HOME and SQLite (migrated
once per session), a shared local SparkSession, and a logbus cluster per module or test.

Airflow reads its configuration when first imported, so the environment is set here,
before any test module imports it."""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="logbus-airflow-home-"))
atexit.register(shutil.rmtree, AIRFLOW_HOME, True)  # one per test process; 166 piled up in /tmp before
os.environ.update({
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags" / "examples"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME / 'airflow.db'}",
    "PYSPARK_PYTHON": sys.executable,
    "PYSPARK_DRIVER_PYTHON": sys.executable,
    "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
})

from harness.cluster import LocalCluster  # noqa: E402
from harness.zookeeper import with_chroot  # noqa: E402


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """`airflow db migrate` once per session."""
    subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ))
    return AIRFLOW_HOME


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("logbus-provider-tests")
               .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    yield session
    session.stop()
    # py4j logs "closing connection" at INFO from __del__ at interpreter exit, after
    # pytest has closed the streams it captured: a "Logging error" traceback, no harm
    logging.getLogger("py4j").setLevel(logging.WARNING)


def new_chroot(zookeeper) -> str:
    return with_chroot(zookeeper.connect_string, f"/provider-{uuid.uuid4().hex[:10]}")


@pytest.fixture(scope="module")
def module_cluster(zookeeper, tmp_path_factory):
    """Two brokers, 2 partitions per topic, shared by a module's tests."""
    connect = new_chroot(zookeeper)
    local = LocalCluster(connect, tmp_path_factory.mktemp("brokers"),
                         settings={"log.flush.interval.ms": 20, "num.partitions": 2})
    try:
        local.start_broker(0)
        local.start_broker(1)
        yield local
    finally:
        local.stop()


def use_logbus_connection(zookeeper_connect: str) -> None:
    os.environ["AIRFLOW_CONN_LOGBUS_DEFAULT"] = json.dumps(
        {"conn_type": "logbus", "extra": {"zookeeper": zookeeper_connect}})


def load_dag(file_name: str, env: dict[str, str]):
    """Import an example DAG file afresh with `env` applied (the examples read it at parse time)."""
    os.environ.update(env)
    path = ROOT / "dags" / "examples" / file_name
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}_{uuid.uuid4().hex[:6]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


class CountingSessions:
    """Wraps the client library's real `connect_zookeeper` (where the provider's cluster
    handle opens its session): every call opens a real ZooKeeper session."""

    def __init__(self, real) -> None:
        self.real, self.clients = real, []

    def __call__(self, *args, **kwargs):
        client = self.real(*args, **kwargs)
        self.clients.append(client)
        return client


@pytest.fixture
def sessions(monkeypatch) -> CountingSessions:
    import broker.client.metadata as metadata_module

    counter = CountingSessions(metadata_module.connect_zookeeper)
    monkeypatch.setattr(metadata_module, "connect_zookeeper", counter)
    return counter
