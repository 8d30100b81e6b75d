"""The replication tests' ZooKeeper is a three-server ensemble, as in production: one
per test process, with a chroot of its own for every test (`zk_connect`). The tests that
stop and start ZooKeeper servers take a private `zookeeper_ensemble` instead."""

from __future__ import annotations

import pytest

from harness.zookeeper import ZooKeeperEnsemble


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory) -> ZooKeeperEnsemble:
    """Three servers, overriding the single server of tests/conftest.py here."""
    ensemble = ZooKeeperEnsemble(tmp_path_factory.mktemp("replication-ensemble")).start()
    yield ensemble
    ensemble.stop()
