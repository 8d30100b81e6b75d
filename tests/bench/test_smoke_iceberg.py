"""bench.iceberg at a tiny size (tests/bench/smoke.py says what is checked); a file of its own
so that pytest-xdist runs it beside the other benchmarks. It starts Spark and a catalog
(two minutes of one worker on a loaded machine), so it runs in `make test-long`: the
Iceberg load itself is `make test`'s, in tests/provider/test_iceberg_target.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.smoke import check_runs_at_a_tiny_size, timed


@pytest.mark.slow
@pytest.mark.parametrize("module", timed(["iceberg"], long=("iceberg",)))
def test_iceberg_runs_at_a_tiny_size(module: str, tmp_path: Path) -> None:
    check_runs_at_a_tiny_size(module, tmp_path)
