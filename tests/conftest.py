"""Fixtures that own real processes: one ZooKeeper server per test session (each test
gets its own chroot, so tests cannot see each other's brokers or topics), a three-server
ZooKeeper ensemble for the tests that ask for one, and broker
processes started through `logbus-broker`; a PostgreSQL server for the tests that
request `postgres`. Everything is stopped even when a test fails; a failing test's
broker logs are printed."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from harness.cluster import LocalCluster
from harness.postgres import PostgresServer
from harness.s3 import S3Server
from harness.zookeeper import ZooKeeperEnsemble, ZooKeeperServer, with_chroot


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory) -> ZooKeeperServer:
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")).start()
    yield server
    server.stop()


@pytest.fixture
def zookeeper_ensemble(tmp_path) -> ZooKeeperEnsemble:
    """Three ZooKeeper servers of the test's own; it may stop and restart them one at a
    time (`stop_server(i)`, `start_server(i)`)."""
    ensemble = ZooKeeperEnsemble(tmp_path / "ensemble").start()
    yield ensemble
    ensemble.stop()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory) -> PostgresServer:
    """A private PostgreSQL server (Debian's binaries, 127.0.0.1, trust auth), started
    only for the tests that ask for it; `postgres.create_database(name)` gives each user
    its own database."""
    server = PostgresServer(tmp_path_factory.mktemp("postgres")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> S3Server:
    """A real S3 API server (moto's, on 127.0.0.1), started only for the tests that ask
    for it; each takes its own bucket (`s3_server.create_bucket(name)`)."""
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()


@pytest.fixture
def zk_connect(zookeeper: ZooKeeperServer) -> str:
    """A connect string with a fresh chroot for this test."""
    return with_chroot(zookeeper.connect_string, f"/test-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def zk(zk_connect: str) -> KazooClient:
    client = KazooClient(zk_connect)
    client.start(30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path, request) -> LocalCluster:
    """Start brokers with `cluster.start_broker(id, {"key": value})`; fast flushes by default."""
    local = LocalCluster(zk_connect, tmp_path, settings={"log.flush.interval.ms": 20})
    yield local
    local.stop()
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        for broker in local.brokers.values():
            print(f"\n---- broker {broker.broker_id} log ({broker.log_path}) ----\n{broker.log_tail(60)}")
