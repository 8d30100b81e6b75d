"""An hour announced complete and then changed (issue 39, item 2): the next audit — an
hourly run of a later hour — withdraws it: the table's complete-through watermark falls
back to that hour, the audit fails naming it, later audits announce nothing past it, and
once the table is mended the hour is announced again.

Real producers and their monitoring events on a real broker; a directory table whose
batch is committed by the protocol (its rows written as the load job lays them out, no
Spark); `LogbusAuditOperator.execute` as a task runs it.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_provider_logbus.operators.audit import LogbusAuditOperator, LogbusCompletenessError
from airflow_provider_logbus.plan import BatchPlan
from airflow_provider_logbus.targets.directory import DirectoryTarget

from .conftest import use_logbus_connection
from .helpers import FakeTaskInstance, produce_unloaded
from .stagingutil import T0, plan, write_staging

pytestmark = pytest.mark.slow
TOPIC = TABLE = "announced"
ROWS = 20
H = timedelta(hours=1)
START = datetime.fromtimestamp(T0 / 1000, timezone.utc)  # 2024-01-01T00:00Z: the hour the batch loaded


def run_audit(warehouse: Path, hour: int) -> dict:
    """The hourly audit task of the interval [START + hour, START + hour + 1h)."""
    operator = LogbusAuditOperator(task_id="audit", table=TABLE, topic=TOPIC, warehouse=str(warehouse),
                                   target="directory", grace=timedelta(0))
    start = START + hour * H
    return operator.execute({"data_interval_start": start, "data_interval_end": start + H,
                             "run_id": f"run-of-hour-{hour}", "ti": FakeTaskInstance({}), "outlet_events": None})


def kept_report(warehouse: Path, hour: int) -> dict:
    start = START + hour * H
    return json.loads((warehouse / "_audit" / TABLE / f"{start:%Y%m%dT%H%M%S}_{start + H:%Y%m%dT%H%M%S}.json")
                      .read_text())


def test_an_hour_changed_after_its_announcement_is_withdrawn_by_the_next_audit(cluster, airflow_db, tmp_path):
    cluster.start_broker(0)
    use_logbus_connection(cluster.zookeeper)
    produce_unloaded(cluster.zookeeper, TOPIC, [T0 + i * 100 for i in range(ROWS)])
    target = DirectoryTarget(tmp_path, TABLE)
    spans = [{"topic": TOPIC, "partition": 0, "start": 0, "end": ROWS * 100}]
    staging = target.prepare_staging("b1", 1)
    write_staging(staging, spans)  # ROWS rows stamped in the hour of T0, as the load job writes them
    target.commit(BatchPlan.from_dict(plan("b1", spans, table=TABLE)), staging, "loading-run")

    assert run_audit(tmp_path, 0)["announced_hours"] == ["2024-01-01T00:00Z"]
    assert target.complete_through() == T0 + 3_600_000

    (batch_file,) = target.batch_dir("b1").rglob("*.parquet")
    copy = batch_file.with_name("copied-by-hand.parquet")
    shutil.copy(batch_file, copy)  # the hour's rows a second time, outside the commit protocol
    with pytest.raises(LogbusCompletenessError, match=r"hour 2024-01-01T00:00Z was announced complete and is "
                                                      r"now duplicated.*complete-through falls back"):
        run_audit(tmp_path, 1)
    assert target.complete_through() == T0
    withdrawn = kept_report(tmp_path, 1)["withdrawn_hours"]
    assert [(h["hour"], h["status"]) for h in withdrawn] == [("2024-01-01T00:00Z", "duplicated")]
    assert str(copy) in " ".join(withdrawn[0]["reasons"])

    later = run_audit(tmp_path, 2)  # the hour is withdrawn already: this audit's own hour passes
    assert later["status"] == "ok" and later["announced_hours"] == [] and target.complete_through() == T0

    copy.unlink()  # the table mended: the hour is announced again
    assert run_audit(tmp_path, 3)["announced_hours"] == ["2024-01-01T00:00Z"]
    assert target.complete_through() == T0 + 3_600_000
