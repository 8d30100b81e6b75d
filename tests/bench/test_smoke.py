"""Every benchmark but the two Spark ones at a tiny size (tests/bench/smoke.py says what is
checked), and a failing benchmark that must exit at once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.bench.smoke import SMOKES, check_runs_at_a_tiny_size, run_bench, timed


SPARK = ("spark_load", "spark_stages", "avro_decode", "iceberg")  # test_smoke_spark_load.py, test_smoke_iceberg.py


@pytest.mark.slow
@pytest.mark.parametrize("module", timed([m for m in SMOKES if m not in SPARK]))
def test_benchmark_runs_at_a_tiny_size(module: str, tmp_path: Path) -> None:
    check_runs_at_a_tiny_size(module, tmp_path)


@pytest.mark.slow
def test_failing_benchmark_exits_at_once_and_stops_what_it_started(tmp_path: Path) -> None:
    """The failure of issue 25: bench.spark_load has produced its data (ZooKeeper and a
    broker running, ZooKeeper clients opened) when Spark fails to import; it used to
    print the ImportError and then hang at exit, its kazoo client retrying against the
    stopped server. Here a `pyspark` that cannot be imported comes first on PYTHONPATH."""
    fake = tmp_path / "fake"
    (fake / "pyspark").mkdir(parents=True)
    (fake / "pyspark" / "__init__.py").write_text('raise ImportError("pyspark made unimportable by the smoke test")\n')
    pythonpath = os.pathsep.join(p for p in (str(fake), os.environ.get("PYTHONPATH")) if p)
    run = run_bench("spark_load", ["--messages", "200"], tmp_path, 180, env={"PYTHONPATH": pythonpath},
                    watch="Traceback", after_watch=15)
    assert run.code != 0, run.output[-4000:]
    assert "200 messages, " in run.output, f"it failed before producing its data:\n{run.output[-4000:]}"
    assert "ImportError: pyspark made unimportable by the smoke test" in run.output, run.output[-4000:]


@pytest.mark.slow
def test_a_benchmark_terminated_midway_stops_what_it_started(tmp_path: Path) -> None:
    """SIGTERM (a `kill`, a runner's timeout) ended Python at once: ZooKeeper and the
    broker, in sessions of their own, ran on with their scratch directory — two killed
    `bench.spark_load` runs left four servers. `scratch_cluster` makes it unwind."""
    run = run_bench("raw", ["--messages", "300000"], tmp_path, 180, watch="produce batch  1", after_watch=30,
                    terminate=True)
    assert run.code != 0 and "produce batch 50" not in run.output, run.output[-4000:]
