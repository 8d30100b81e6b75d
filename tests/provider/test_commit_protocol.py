"""The directory target's compare-and-swap commit, raced by real processes and killed
with SIGKILL at each step: every message lands exactly once, every run succeeds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from airflow_provider_logbus.plan import BatchPlan
from airflow_provider_logbus.targets.base import TargetError
from airflow_provider_logbus.targets.directory import DirectoryTarget

from .stagingutil import child_command, offsets, plan, wait_all, write_staging

TOPIC = "t"


def ranges(*spans: tuple[int, int, int]) -> list[dict]:
    return [{"topic": TOPIC, "partition": p, "start": s, "end": e} for p, s, e in spans]


def rows(warehouse: Path, table: str = "tbl") -> list[tuple[int, int]]:
    """(partition, offset) of every row a plain reader sees."""
    if not any((warehouse / table).glob("batch_id=*/**/*.parquet")):
        return []
    t = ds.dataset(str(warehouse / table), format="parquet", partitioning="hive").to_table(
        columns=["partition", "offset"])
    return sorted(zip(t["partition"].to_pylist(), t["offset"].to_pylist()))


def staged(target: DirectoryTarget, batch_id: str, attempt: int, spans: list[dict]) -> str:
    staging = target.prepare_staging(batch_id, attempt)
    write_staging(staging, spans)
    return staging


def race(warehouse: Path, children: list[tuple[dict, str]], tmp_path: Path) -> list[dict]:
    """Start one committing process per (plan, staging), release them together."""
    barrier = tmp_path / "go"
    procs, results = [], []
    for i, (plan_dict, staging) in enumerate(children):
        result = tmp_path / f"result-{i}.json"
        results.append(result)
        procs.append(subprocess.Popen(child_command(str(warehouse), plan_dict, staging, str(result),
                                                    barrier=str(barrier)), cwd=Path(__file__).parents[2]))
    barrier.touch()
    codes = wait_all(procs, timeout=120)
    assert codes == [0] * len(procs)
    return [json.loads(r.read_text()) for r in results]


def test_overlapping_batches_committed_at_once_load_every_message_exactly_once(tmp_path):
    warehouse, target = tmp_path / "wh", DirectoryTarget(tmp_path / "wh", "tbl")
    planned = ranges((0, 0, 5000), (1, 0, 3000))
    children = [(plan(f"b{i}", planned), staged(target, f"b{i}", 1, planned)) for i in range(6)]
    results = race(warehouse, children, tmp_path)
    expected = sorted((p, o) for p, e in ((0, 5000), (1, 3000)) for o in offsets(0, e))
    assert rows(warehouse) == expected
    assert sum(r["row_count"] for r in results) == len(expected)
    assert sum(r["planned_ranges"] is None for r in results) == 1  # one winner; five re-planned to nothing
    assert all(r["published_now"] for r in results)


def test_a_batch_that_lost_the_race_keeps_only_the_rows_past_the_committed_end(tmp_path):
    target = DirectoryTarget(tmp_path, "tbl")
    first = ranges((0, 0, 1000))
    target.commit(BatchPlan.from_dict(plan("b1", first)), staged(target, "b1", 1, first), "r1")
    wider = ranges((0, 0, 2500))  # planned before b1 committed
    result = target.commit(BatchPlan.from_dict(plan("b2", wider)), staged(target, "b2", 1, wider), "r2")
    record = result.record.to_dict()
    assert record["ranges"] == ranges((0, 1000, 2500)) and record["planned_ranges"] == wider
    assert result.record.row_count == 15
    assert rows(tmp_path) == [(0, o) for o in offsets(0, 2500)]


def test_two_attempts_of_one_batch_committed_at_once_publish_it_once(tmp_path):
    warehouse, target = tmp_path / "wh", DirectoryTarget(tmp_path / "wh", "tbl")
    spans = ranges((0, 0, 2000))
    results = race(warehouse, [(plan("b1", spans), staged(target, "b1", 1, spans)),
                               (plan("b1", spans), staged(target, "b1", 2, spans))], tmp_path)
    assert sorted(r["published_now"] for r in results) == [False, True]
    assert [p.name for p in (warehouse / "tbl").glob("batch_id=*")] == ["batch_id=b1"]
    assert rows(warehouse) == [(0, o) for o in offsets(0, 2000)]
    assert not list((warehouse / "tbl" / "_staging").iterdir())


@pytest.mark.parametrize("kill_at", ["before-rename", "after-rename"])
def test_a_commit_killed_at_each_step_is_completed_by_its_retry_exactly_once(tmp_path, kill_at):
    warehouse, target = tmp_path / "wh", DirectoryTarget(tmp_path / "wh", "tbl")
    spans = ranges((0, 0, 1500))
    staging = staged(target, "b1", 1, spans)
    killed = subprocess.run(child_command(str(warehouse), plan("b1", spans), staging, str(tmp_path / "r"),
                                          kill_at=kill_at), cwd=Path(__file__).parents[2])
    assert killed.returncode == -9
    result = target.commit(BatchPlan.from_dict(plan("b1", spans)), staging, "retry")
    assert rows(warehouse) == [(0, o) for o in offsets(0, 1500)]
    assert [p.name for p in (warehouse / "tbl").glob("batch_id=*")] == ["batch_id=b1"]
    assert not [p for p in (warehouse / "tbl").rglob("*.tmp")]  # no temporary record left anywhere
    assert result.record.row_count == 15


def test_a_retry_after_the_publish_needs_no_staging(tmp_path):
    target = DirectoryTarget(tmp_path, "tbl")
    spans = ranges((0, 0, 500))
    target.commit(BatchPlan.from_dict(plan("b1", spans)), staged(target, "b1", 1, spans), "r")
    again = target.commit(BatchPlan.from_dict(plan("b1", spans)), None, "r")
    assert not again.published_now and again.record.row_count == 5


def test_committed_ends_come_from_the_cache_only_for_the_batches_it_folded(tmp_path):
    target = DirectoryTarget(tmp_path, "tbl")
    for i, end in enumerate((500, 900, 1400)):
        spans = ranges((0, (0, 500, 900)[i], end), (1, 0, 100) if i == 0 else (1, 100, 100))
        target.commit(BatchPlan.from_dict(plan(f"b{i}", spans)), staged(target, f"b{i}", 1, spans), "r")
    assert target.committed_end_offsets(TOPIC) == {0: 1400, 1: 100}
    cache = tmp_path / "tbl" / "_logbus_ends.json"
    assert json.loads(cache.read_text())["batch_ids"] == ["b0", "b1", "b2"]
    cache.write_text(json.dumps({"batch_ids": ["b0", "b1", "b2", "gone"], "ends": {TOPIC: {"0": 99}}}))
    assert target.committed_end_offsets(TOPIC) == {0: 1400, 1: 100}  # names a batch that is not there: ignored
    cache.write_text("garbage")
    assert target.committed_end_offsets(TOPIC) == {0: 1400, 1: 100}


@pytest.mark.parametrize("warehouse", ["s3://bucket/warehouse", "gs://bucket/wh"])
def test_the_directory_target_refuses_an_object_store_warehouse_naming_why(warehouse):
    with pytest.raises(TargetError, match="cannot do atomically; use target='iceberg'"):
        DirectoryTarget(warehouse, "tbl")
