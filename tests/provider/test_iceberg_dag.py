"""The example hourly DAG into an Iceberg table (embedded SQLite catalog): real
ZooKeeper and brokers, Airflow `dag.test()`, Spark through spark-submit.

One scenario for the module, on yesterday's hours: interval 1 with its first spark-submit
killed after Spark started writing into the table's staging; interval 2 with a few values
that do not parse; then interval 2 run again. Each test checks one behaviour of it; the
last ones run the example maintenance DAG (compacting the audited hours), then the
example daily audit, configured as the hourly DAG was, over that day, then again once an
hour of it holds messages no load took.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.targets.iceberg import IcebergTarget
from harness.process import wait_until

from .conftest import load_dag, use_logbus_connection
from .helpers import all_offsets, produce, produce_unloaded, produce_values, run_daily_audit, yesterday_start
from .test_hourly_dag import KillFirstLoad, task_states

pytestmark = [pytest.mark.slow, pytest.mark.long]
HOUR = 3_600_000
TOPIC = TABLE = "clicks"
SCHEMA = "server string, n long NOT NULL, ts_ms long"
BAD_VALUES = [b"not json", b"[1, 2]", b'{"server": "web-9", "n": "seven", "ts_ms": 1}', b'{"server": "web-9"}']


def utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def table_offsets(target: IcebergTarget, identifier: str | None = None) -> list[tuple[int, int]]:
    table = target.catalog.load_table(identifier or target.identifier)
    t = table.scan(selected_fields=("partition", "offset")).to_arrow()
    return sorted(zip(t["partition"].to_pylist(), t["offset"].to_pylist()))


@pytest.fixture(scope="module")
def scenario(module_cluster, airflow_db, tmp_path_factory):
    zk = module_cluster.zookeeper
    use_logbus_connection(zk)
    warehouse = tmp_path_factory.mktemp("iceberg-warehouse")
    env = {"LOGBUS_TOPIC": TOPIC, "LOGBUS_TABLE": TABLE, "LOGBUS_WAREHOUSE": str(warehouse),
           "LOGBUS_GROUP": "loader", "LOGBUS_SENSOR_GRACE_MINUTES": "0", "LOGBUS_AUDIT_GRACE_MINUTES": "0",
           "LOGBUS_RETRY_DELAY_SECONDS": "0", "LOGBUS_VALUE_SCHEMA": SCHEMA, "LOGBUS_TARGET": "iceberg",
           "LOGBUS_MAX_REJECT_RATE": "0.5", "LOGBUS_DAILY_AUDIT_GRACE_MINUTES": "0"}
    dag = load_dag("logbus_hourly_load.py", env)
    day = yesterday_start()
    h0 = int(day.timestamp() * 1000) + 10 * HOUR
    ends = [h0 + HOUR, h0 + 2 * HOUR]

    def tail_past(end: int) -> None:
        with LogbusCluster(zk) as c:
            wait_until(lambda: all(c.has_data_after(TOPIC, p, end) for p in c.partitions(TOPIC)), 30, "tail data")

    out = {"warehouse": warehouse, "ends": ends, "zk": zk, "env": env, "day": day}
    produce(zk, TOPIC, [h0 + i * (HOUR // 100) for i in range(100)] + [ends[0] + 1000 * i for i in range(1, 9)])
    tail_past(ends[0])
    out["offsets_1"] = wait_until(lambda: o if len(o := all_offsets(zk, TOPIC)) == 108 else None, 30,
                                  "all 108 messages visible (acks=1 answers before the flush)")
    target = IcebergTarget(TABLE, warehouse=str(warehouse))
    staging_root = warehouse / "logbus" / TABLE / "data" / "_logbus_staging"
    killer = KillFirstLoad(staging_root / f"{utc(h0):%Y%m%dT%H%M%S}_{utc(ends[0]):%Y%m%dT%H%M%S}.1")
    killer.start()
    try:
        out["dr1"] = dag.test(logical_date=utc(ends[0]))
    finally:
        killer.stop.set()
    out["killed"], out["states_1"] = killer.killed, task_states(out["dr1"])
    out["rows_after_1"] = table_offsets(target)

    produce(zk, TOPIC, [ends[0] + 60_000 + i * (HOUR // 80) for i in range(80)])
    produce_values(zk, TOPIC, BAD_VALUES, ends[0] + 120_000)
    produce(zk, TOPIC, [ends[1] + 1000 * i for i in range(1, 9)])
    tail_past(ends[1])
    out["offsets_2"] = wait_until(lambda: o if len(o := all_offsets(zk, TOPIC)) == 200 else None, 30,
                                  "all 200 messages visible")
    out["dr2"] = dag.test(logical_date=utc(ends[1]))
    out["states_2"] = task_states(out["dr2"])
    out["rows_after_2"] = table_offsets(target)
    out["rejects"] = table_offsets(target, target.rejects_identifier)
    out["batches"] = target.batches()
    out["dr2_again"] = dag.test(logical_date=utc(ends[1]))
    out["rows_after_rerun"] = table_offsets(target)
    out["snapshots_after_rerun"] = len(target.table_or_fail().metadata.snapshots)
    out["table"] = target.table_or_fail()
    out["complete_through"] = target.complete_through()
    out["reports"] = [json.loads(p.read_text()) for p in sorted((warehouse / "_audit").rglob("*.json"))]
    target.close()
    return out


def test_both_runs_succeed_and_the_killed_load_was_retried(scenario):
    assert scenario["killed"], "the first spark-submit was never seen"
    assert str(scenario["dr1"].state) == "success", scenario["states_1"]
    assert scenario["states_1"]["load"] == ("success", 2)
    assert str(scenario["dr2"].state) == "success", scenario["states_2"]


def test_every_message_is_in_the_table_or_its_rejects_exactly_once(scenario):
    rows, rejects = scenario["rows_after_2"], scenario["rejects"]
    assert len(rows) == len(set(rows)) and len(rejects) == len(set(rejects)) == len(BAD_VALUES)
    assert set(rows) | set(rejects) == scenario["offsets_2"] and not set(rows) & set(rejects)
    assert set(scenario["rows_after_1"]) == scenario["offsets_1"]


def test_each_batch_is_one_snapshot_and_the_second_starts_where_the_first_ended(scenario):
    first, second = scenario["batches"]
    assert first.end_offsets(TOPIC) == {r.partition: r.start for r in second.ranges}
    assert first.row_count + second.row_count == len(scenario["rows_after_2"])
    assert second.rejected_count == len(BAD_VALUES)
    assert json.loads(scenario["table"].properties["logbus.committed-offsets"])[TOPIC] == {
        str(p): e for p, e in second.end_offsets(TOPIC).items()}


def test_a_rerun_of_a_committed_interval_adds_no_row_and_no_snapshot(scenario):
    assert str(scenario["dr2_again"].state) == "success"
    assert scenario["rows_after_rerun"] == scenario["rows_after_2"]
    batch_snapshots = [s for s in scenario["table"].metadata.snapshots
                       if "logbus.batch-id" in s.summary.additional_properties]
    assert len(batch_snapshots) == 2


def test_the_audit_accounts_for_rejected_values_and_announces_complete_hours(scenario):
    first, second = (r for r in scenario["reports"] if "produced" in r)  # interval 2's: the re-run's report
    for report in (first, second):
        assert report["status"] == "ok" and report["missing"] == 0 and report["duplicated"] == 0
        assert report["produced"] == report["loaded"] + report["rejected"]
    assert second["rejected"] == len(BAD_VALUES)
    assert len(first["announced_hours"]) == 1 and second["announced_hours"] == []  # announced by its first run
    assert scenario["complete_through"] == scenario["ends"][1]


@pytest.fixture(scope="module")
def maintained(scenario) -> dict:
    """The example maintenance DAG (`dag.test()`) over the table the hourly DAG loaded,
    then interval 2 of the hourly DAG once more."""
    target = IcebergTarget(TABLE, warehouse=str(scenario["warehouse"]))
    files_before = {f.path for f in target.contents().files}
    run = load_dag("logbus_table_maintenance.py", scenario["env"]).test(logical_date=utc(scenario["ends"][1]))
    out = {"state": str(run.state), "states": task_states(run), "files_before": files_before,
           "files_after": {f.path for f in target.contents().files}, "rows": table_offsets(target)}
    out["rerun"] = load_dag("logbus_hourly_load.py", scenario["env"]).test(logical_date=utc(scenario["ends"][1]))
    out["rows_after_rerun"] = table_offsets(target)
    out["batches"] = target.batches()
    target.close()
    return out


def test_the_maintenance_dag_compacts_the_audited_hours_changing_no_row(maintained, scenario):
    assert maintained["state"] == "success", maintained["states"]
    assert len(maintained["files_after"]) < len(maintained["files_before"])  # hours in several files now in one each
    assert maintained["rows"] == maintained["rows_after_rerun"] == scenario["rows_after_2"]
    assert str(maintained["rerun"].state) == "success"
    assert [b.batch_id for b in maintained["batches"]] == [b.batch_id for b in scenario["batches"]]


@pytest.fixture(scope="module")
def daily_audits(scenario, maintained) -> dict:
    """The example daily audit over the day the hourly DAG loaded into Iceberg, then over
    the same day once 20 messages stamped 15:00-15:20 — an hour no load ran for — were
    produced."""
    out = {"complete": run_daily_audit(scenario["env"], scenario["day"])}
    hour = int(scenario["day"].timestamp() * 1000) + 15 * HOUR
    produce_unloaded(scenario["zk"], TOPIC, [hour + i * 60_000 for i in range(20)])
    out["hour_missing"] = run_daily_audit(scenario["env"], scenario["day"])
    return out


def test_the_daily_audit_passes_a_day_the_hourly_dag_loaded_into_iceberg(daily_audits, scenario):
    state, report = daily_audits["complete"]
    assert state == "success", report
    assert report["status"] == "ok" and report["missing"] == 0 and report["duplicated"] == 0
    assert report["loaded"] + report["rejected"] == report["produced"] == len(scenario["offsets_2"])
    assert report["rejected"] == len(BAD_VALUES)


def test_the_daily_audit_fails_a_day_with_an_hour_missing_from_iceberg(daily_audits):
    state, report = daily_audits["hour_missing"]
    assert state == "failed" and report["status"] == "failed"
    missing = {h["hour"][-6:]: h["missing"] for h in report["hours"] if h["missing"]}
    assert missing == {"15:00Z": 20}
