"""bench.spark_load, bench.spark_stages and bench.avro_decode at a tiny size (tests/bench/smoke.py says what is checked); a file of its own
so that pytest-xdist runs it beside the other benchmarks. Each starts Spark (a minute
or more of one worker on a loaded machine): `make test` runs spark_load, which also
covers the S3 path; the other two run in `make test-long`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.smoke import check_runs_at_a_tiny_size, timed


@pytest.mark.slow
@pytest.mark.parametrize("module", timed(["spark_load", "spark_stages", "avro_decode"], long=("spark_stages", "avro_decode")))
def test_spark_load_runs_at_a_tiny_size(module: str, tmp_path: Path) -> None:
    check_runs_at_a_tiny_size(module, tmp_path)
