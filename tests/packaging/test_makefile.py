"""The Makefile's set-up: `make demo` installs only what the demo runs (issue 39).

The demo runs ZooKeeper, brokers and Spark; Chromium (the page's browser tests) and
PostgreSQL (the tests' private metadata database) are the tests' alone, and installing
them made a first `make demo` minutes longer. `make -n` prints every command a target
would run, its prerequisites' included, without running any.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def planned(target: str) -> str:
    """What `make <target>` would run, as text (the virtualenv counted as built)."""
    return subprocess.run(["make", "-n", "-o", ".venv/.installed", target], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def test_the_demo_installs_neither_chromium_nor_postgresql():
    demo = planned("demo")
    assert "zookeeper" in demo, demo  # the demo's own prerequisites are still there
    assert "chromium" not in demo and "postgresql" not in demo, demo


@pytest.mark.parametrize("target", ["test", "test-long"])
def test_the_tests_install_chromium_and_postgresql(target):
    commands = planned(target)
    assert "zookeeper" in commands and "chromium" in commands and "postgresql" in commands, commands
