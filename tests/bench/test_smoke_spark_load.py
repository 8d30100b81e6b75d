"""bench.spark_load, bench.spark_stages and bench.avro_decode at a tiny size (tests/bench/smoke.py says what is checked); a file of its own
so that pytest-xdist runs it beside the other benchmarks. Each starts Spark (a minute
or more of one worker on a loaded machine), so all three run in `make test-long`; the
load itself, Spark and S3 included, is `make test`'s in tests/provider/."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.smoke import check_runs_at_a_tiny_size, timed


@pytest.mark.slow
@pytest.mark.parametrize("module", timed(["spark_load", "spark_stages", "avro_decode"], long=("spark_load", "spark_stages", "avro_decode")))
def test_spark_load_runs_at_a_tiny_size(module: str, tmp_path: Path) -> None:
    check_runs_at_a_tiny_size(module, tmp_path)
