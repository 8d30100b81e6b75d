"""A run with nothing in its ranges starts no Spark application (issue 39, item 4): a
backfill of an hour a later run has already loaded. Real ZooKeeper and brokers, the
example hourly DAG into Iceberg with `dag.test()`, spark-submit with Spark's event log on
(`SPARK_CONF_DIR`), so every Spark application that starts leaves a log.

The scenario: hours 10 and 11 of yesterday produced; the run of 11:00-12:00 loads both
(a run loads everything up to the latest offset); then the run of 10:00-11:00 — the
backfill — finds its ranges empty.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import pytest

from airflow_provider_logbus.batch import audit_inputs, await_broker_counts
from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.completeness import judge
from airflow_provider_logbus.plan import batch_id_for
from airflow_provider_logbus.targets.iceberg import IcebergTarget
from harness.process import wait_until

from .conftest import load_dag, use_logbus_connection
from .helpers import process_output, produce, yesterday_start
from .test_hourly_dag import task_states

pytestmark = [pytest.mark.slow, pytest.mark.long]
TOPIC = TABLE = "backfilled"
SCHEMA = "server string, n long, ts_ms long"
HOUR = timedelta(hours=1)
SPARK_SUBMITS = "Spark-Submit cmd"  # the stock hook's line before it starts spark-submit


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def applications(event_logs) -> list[str]:
    return sorted(p.name for p in event_logs.iterdir())


def audit_of_hour(zk: str, warehouse, hour: datetime) -> dict:
    """The audit's verdict on one hour, computed by the audit's code now."""
    target = IcebergTarget(TABLE, warehouse=str(warehouse))
    try:
        with LogbusCluster(zk) as cluster:
            inputs = await_broker_counts(cluster, audit_inputs(cluster, target), TOPIC, 60)
        report = inputs.report(TABLE, TOPIC, ms(hour), ms(hour + HOUR), 0.999)
    finally:
        target.close()
    return judge(report, now_ms=ms(datetime.now(timezone.utc)), grace_ms=0)


@pytest.fixture(scope="module")
def scenario(module_cluster, airflow_db, tmp_path_factory):
    zk = module_cluster.zookeeper
    use_logbus_connection(zk)
    warehouse, event_logs = tmp_path_factory.mktemp("warehouse"), tmp_path_factory.mktemp("spark-events")
    conf_dir = tmp_path_factory.mktemp("spark-conf")
    (conf_dir / "spark-defaults.conf").write_text(f"spark.eventLog.enabled true\n"
                                                  f"spark.eventLog.dir file://{event_logs}\n")
    env = {"LOGBUS_TOPIC": TOPIC, "LOGBUS_TABLE": TABLE, "LOGBUS_WAREHOUSE": str(warehouse),
           "LOGBUS_GROUP": "loader", "LOGBUS_SENSOR_GRACE_MINUTES": "0", "LOGBUS_AUDIT_GRACE_MINUTES": "0",
           "LOGBUS_RETRY_DELAY_SECONDS": "0", "LOGBUS_VALUE_SCHEMA": SCHEMA, "LOGBUS_TARGET": "iceberg"}
    dag = load_dag("logbus_hourly_load.py", env)
    ten = yesterday_start() + 10 * HOUR
    produce(zk, TOPIC, [ms(ten) + i * 60_000 for i in range(60)] + [ms(ten + HOUR) + i * 60_000 for i in range(50)]
            + [ms(ten + 2 * HOUR) + 1000 * i for i in range(1, 9)])  # the sensor's sign that 11:00 is over
    with LogbusCluster(zk) as c:
        wait_until(lambda: all(c.has_data_after(TOPIC, p, ms(ten + 2 * HOUR)) for p in c.partitions(TOPIC)), 30,
                   "tail data")
    out = {"warehouse": warehouse, "zk": zk, "ten": ten}
    saved = os.environ.get("SPARK_CONF_DIR")
    os.environ["SPARK_CONF_DIR"] = str(conf_dir)  # spark-submit reads spark-defaults.conf there
    try:
        with process_output(tmp_path_factory.mktemp("logs") / "eleven.log") as log:
            out["eleven"] = dag.test(logical_date=ten + 2 * HOUR)  # the run of 11:00-12:00: loads everything
        out["eleven_log"] = log.read_text()
        out["apps_after_eleven"] = applications(event_logs)
        out["ten_before"] = audit_of_hour(zk, warehouse, ten)
        with process_output(tmp_path_factory.mktemp("logs") / "ten.log") as log:
            out["ten"] = dag.test(logical_date=ten + HOUR)  # the backfill of 10:00-11:00: nothing left to load
        out["ten_log"] = log.read_text()
        out["ten_states"] = task_states(out["ten"])
        out["apps_after_ten"] = applications(event_logs)
    finally:
        if saved is None:
            os.environ.pop("SPARK_CONF_DIR", None)
        else:
            os.environ["SPARK_CONF_DIR"] = saved
    target = IcebergTarget(TABLE, warehouse=str(warehouse))
    try:
        out["backfill_batch"] = target.batch(batch_id_for(ten, ten + HOUR))
    finally:
        target.close()
    out["ten_report"] = json.loads(next((warehouse / "_audit").rglob(
        f"{batch_id_for(ten, ten + HOUR)}.json")).read_text())
    return out


def test_the_run_that_loads_starts_one_spark_application(scenario):
    assert str(scenario["eleven"].state) == "success"
    assert SPARK_SUBMITS in scenario["eleven_log"]
    assert len(scenario["apps_after_eleven"]) == 1, scenario["apps_after_eleven"]


def test_a_run_whose_ranges_are_all_empty_starts_no_spark_application(scenario):
    assert str(scenario["ten"].state) == "success", scenario["ten_states"]
    assert scenario["apps_after_ten"] == scenario["apps_after_eleven"]  # no event log: no application started
    assert SPARK_SUBMITS not in scenario["ten_log"]
    assert "no Spark application" in scenario["ten_log"]


def test_the_empty_batch_is_still_recorded_so_a_rerun_is_a_no_op(scenario):
    record = scenario["backfill_batch"]
    assert record is not None and record.row_count == 0 and record.rejected_count == 0
    assert record.ranges and all(r.start == r.end for r in record.ranges)


def test_the_audit_of_the_backfilled_hour_is_unchanged(scenario):
    before = scenario["ten_before"]
    after = scenario["ten_report"]
    assert after["status"] == before["status"] == "ok"
    fields = ("produced", "loaded", "rejected", "missing", "duplicated", "status", "tiers")
    assert [{k: h[k] for k in fields} for h in after["hours"]] == [{k: h[k] for k in fields} for h in before["hours"]]
    assert after["hours"][0]["produced"] == after["hours"][0]["loaded"] == 60
    assert not after["offset_gaps"]
