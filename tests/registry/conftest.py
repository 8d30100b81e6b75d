"""Registry processes on the test's ZooKeeper chroot (`zk_connect`), stopped after the
test; a failing test's registry logs are printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.registry import RegistryProcess


@pytest.fixture
def start_registry(zk_connect: str, tmp_path: Path, request):
    started: list[RegistryProcess] = []

    def start(name: str = "registry-0", **kwargs) -> RegistryProcess:
        registry = RegistryProcess(kwargs.pop("zookeeper", zk_connect), tmp_path, name, **kwargs).start()
        started.append(registry)
        return registry

    yield start
    failed = getattr(request.node, "report_call", None) is not None and request.node.report_call.failed
    for registry in started:
        if failed:
            print(f"--- {registry.name} log ---\n{registry.log_tail()}")
        registry.stop()


@pytest.fixture
def registry(start_registry) -> RegistryProcess:
    return start_registry()
