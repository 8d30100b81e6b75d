"""The Airflow page's pure parts: which tables a serialized DAG's audit tasks define
(`ui/tables.py`), and how the audit's hours and batch records become the page's cells
and batch rows (`ui/status.py`). The page against a real api-server and browser is
tests/provider/test_airflow_page.py."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from airflow_provider_logbus.plan import Range
from airflow_provider_logbus.targets.base import BatchRecord
from airflow_provider_logbus.ui.status import batches_by_hour, display_status
from airflow_provider_logbus.ui.tables import parse_timedelta, tables_of, with_loading_dags

HOUR_MS = 3_600_000


def serialized_example(monkeypatch, file_name: str = "logbus_hourly_load.py", **env: str) -> dict:
    """An example DAG as Airflow stores it (DagSerialization, through JSON)."""
    from airflow.serialization.serialized_objects import DagSerialization

    from tests.provider.conftest import load_dag

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    dag = load_dag(file_name, env)
    return json.loads(json.dumps(DagSerialization.to_dict(dag)))


def test_the_audit_task_of_a_serialized_dag_is_a_table_with_its_settings(monkeypatch):
    data = serialized_example(monkeypatch, LOGBUS_TARGET="directory", LOGBUS_TABLE="clicks", LOGBUS_TOPIC="clicks_topic",
                              LOGBUS_WAREHOUSE="/wh", LOGBUS_AUDIT_GRACE_MINUTES="90")
    [table] = tables_of("logbus_hourly_load", data)
    assert (table.dag_id, table.task_id, table.table, table.topic, table.target, table.warehouse) == (
        "logbus_hourly_load", "audit", "clicks", "clicks_topic", "directory", "/wh")
    assert table.grace_ms == 90 * 60_000 and table.threshold == 0.999
    assert (table.logbus_conn_id, table.catalog_conn_id, table.monitoring_topic) == (
        "logbus_default", "logbus_iceberg_default", "_logbus_monitoring")
    assert table.key == "logbus_hourly_load.audit"


def test_a_table_audited_by_another_dag_links_to_the_runs_of_the_dag_that_loads_it(monkeypatch):
    env = {"LOGBUS_TARGET": "iceberg", "LOGBUS_TABLE": "clicks", "LOGBUS_WAREHOUSE": "/wh"}
    dags = {"logbus_hourly_load": serialized_example(monkeypatch, **env),
            "logbus_daily_audit": serialized_example(monkeypatch, "logbus_daily_audit.py", **env)}
    found = with_loading_dags([t for d, data in dags.items() for t in tables_of(d, data)], dags)
    assert [(t.dag_id, t.table, t.load_dag_id) for t in found] == [
        ("logbus_daily_audit", "clicks", "logbus_hourly_load"), ("logbus_hourly_load", "clicks", "logbus_hourly_load")]
    alone = with_loading_dags(tables_of("logbus_daily_audit", dags["logbus_daily_audit"]),
                              {"logbus_daily_audit": dags["logbus_daily_audit"]})
    assert [t.load_dag_id for t in alone] == ["logbus_daily_audit"]  # no DAG it may read commits the table


def test_templated_settings_and_other_operators_are_not_tables(monkeypatch):
    data = serialized_example(monkeypatch)
    audit = next(t["__var"] for t in data["dag"]["tasks"] if t["__var"]["task_id"] == "audit")
    audit["table"] = "{{ var.value.table }}"
    assert tables_of("d", data) == []
    assert tables_of("d", {"dag": {"tasks": []}}) == [] and tables_of("d", {}) == []


@pytest.mark.parametrize("value, expected", [
    ("1:00:00", timedelta(hours=1)), ("2 days, 0:30:00", timedelta(days=2, minutes=30)),
    ("0:00:00", timedelta(0)), (90, timedelta(seconds=90)), ({"__type": "timedelta", "__var": 60.0}, timedelta(minutes=1)),
    (None, timedelta(hours=1)), ("soon", timedelta(hours=1)),
])
def test_serialized_grace_periods_are_read(value, expected):
    assert parse_timedelta(value) == expected


def test_an_hour_nobody_counted_is_no_data_and_verdicts_stay_the_audits():
    quiet = {"status": "complete", "produced": 0, "loaded": 0, "rejected": 0}
    assert display_status(quiet) == "no data"
    assert display_status({**quiet, "rejected": 3}) == "complete"
    for status in ("incomplete", "pending", "duplicated", "unrecorded"):
        assert display_status({**quiet, "status": status}) == status


def record(batch_id: str, counts: list[dict], rejected: list[dict] = ()) -> BatchRecord:
    return BatchRecord(table="t", batch_id=batch_id, interval_start="2024-01-01T00:00:00+00:00",
                       interval_end="2024-01-01T01:00:00+00:00", run_id=f"run-{batch_id}",
                       ranges=[Range("web", 0, 0, 100), Range("other", 0, 0, 5)], counts=counts,
                       row_count=sum(c["count"] for c in counts), rejected=list(rejected),
                       rejected_count=sum(c["count"] for c in rejected), extra={"snapshot_id": 7719492545836353017})


def test_a_batch_is_listed_under_every_hour_it_loaded_rows_or_rejects_of():
    window = lambda hour, minute, n, topic="web": {"topic": topic, "window_start": hour * HOUR_MS + minute * 60_000,  # noqa: E731
                                                   "count": n}
    one = record("a", [window(0, 0, 5), window(0, 50, 5), window(1, 0, 2), window(0, 0, 9, "other")])
    two = record("b", [window(1, 10, 7)], rejected=[window(2, 0, 1)])
    hours = batches_by_hour([one, two], "web")
    assert {h: [(b["batch_id"], b["rows"], b["rejected"]) for b in rows] for h, rows in hours.items()} == {
        0: [("a", 10, 0)], HOUR_MS: [("a", 2, 0), ("b", 7, 0)], 2 * HOUR_MS: [("b", 0, 1)]}
    first = hours[0][0]
    assert (first["run_id"], first["ranges"]) == ("run-a", [{"partition": 0, "start": 0, "end": 100}])
    assert first["snapshot_id"] == "7719492545836353017"  # every digit: a JavaScript number would round it


def test_a_batchs_rejects_are_read_from_its_reject_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_logbus.targets.directory import DirectoryTarget
    from airflow_provider_logbus.targets.iceberg_tables import rejects_schema
    from airflow_provider_logbus.ui.status import reject_rows

    target = DirectoryTarget(tmp_path, "clicks")
    rejects = target.batch_dir("b1") / "_rejects"
    rejects.mkdir(parents=True)
    values = [b"not json", b"[1, 2]", "caf\u00e9 {".encode()] + [b"x" * 500] * 200
    pq.write_table(pa.table({
        "topic": ["web"] * len(values), "partition": pa.array([1] * len(values), pa.int32()),
        "offset": pa.array(range(0, 10 * len(values), 10), pa.int64()),
        "timestamp": pa.array([0] * len(values), pa.timestamp("us", tz="UTC")), "key": pa.array([None] * len(values),
                                                                                                 pa.binary()),
        "headers": [None] * len(values), "value": values, "error": ["not valid JSON", "not a JSON object: an array", "not valid JSON"] + ["big"] * 200,
    }, schema=rejects_schema()), rejects / "part-0.parquet")
    answer = reject_rows(target, "b1")
    assert answer["files"] == [str(rejects / "part-0.parquet")]
    assert len(answer["rows"]) == 100  # the page shows the first ones
    assert answer["rows"][:2] == [
        {"partition": 1, "offset": 0, "timestamp": "1970-01-01T00:00:00+00:00", "value": "not json",
         "error": "not valid JSON"},
        {"partition": 1, "offset": 10, "timestamp": "1970-01-01T00:00:00+00:00", "value": "[1, 2]",
         "error": "not a JSON object: an array"}]
    assert answer["rows"][2]["value"] == "caf\u00e9 {" and len(answer["rows"][3]["value"]) == 200
    assert reject_rows(target, "no-such-batch") == {"batch_id": "no-such-batch", "files": [], "rows": []}


def test_a_table_two_dags_audit_is_one_entry_with_both_audits(monkeypatch):
    from airflow_provider_logbus.ui.tables import page_tables

    env = {"LOGBUS_TARGET": "iceberg", "LOGBUS_TABLE": "clicks", "LOGBUS_WAREHOUSE": "/wh"}
    dags = {"logbus_daily_audit": serialized_example(monkeypatch, "logbus_daily_audit.py", **env),
            "logbus_hourly_load": serialized_example(monkeypatch, **env)}
    audits = with_loading_dags([t for d, data in dags.items() for t in tables_of(d, data)], dags)
    elsewhere = replace(audits[0], dag_id="other_dag", warehouse="/other")  # another table of the same name
    entries = {t.primary.warehouse: t for t in page_tables(audits + [elsewhere])}
    clicks, other = entries["/wh"], entries["/other"]
    assert len(entries) == 2
    assert [a.key for a in clicks.audits] == ["logbus_hourly_load.audit", "logbus_daily_audit.audit"]
    assert clicks.key == "logbus_hourly_load.audit"  # the loading DAG's own audit colours the page
    assert [a.key for a in other.audits] == ["other_dag.audit"]
    listed = clicks.as_json()
    assert (listed["table"], listed["key"], listed["load_dag_id"]) == ("clicks", "logbus_hourly_load.audit",
                                                                       "logbus_hourly_load")
    assert [(a["key"], a["grace_ms"]) for a in listed["audits"]] == [
        ("logbus_hourly_load.audit", 60 * 60_000), ("logbus_daily_audit.audit", 120 * 60_000)]


def audited(task: str, grace_minutes: int, dag_id: str = "hourly") -> "AuditedTable":
    from airflow_provider_logbus.ui.status import AuditedTable

    return AuditedTable(dag_id=dag_id, task_id=task, table="t", topic="web", target="directory", warehouse="/wh",
                        catalog_conn_id="c", logbus_conn_id="l", threshold=0.999, grace_ms=grace_minutes * 60_000,
                        monitoring_topic="_logbus_monitoring", load_dag_id="hourly")


def inputs(batches: list[BatchRecord], produced: dict[int, int], files=None):
    from airflow_provider_logbus.batch import AuditInputs

    return AuditInputs({("web", w): n for w, n in produced.items()}, {}, batches, files)


def window(hour: int, n: int) -> dict:
    return {"topic": "web", "window_start": T0 + hour * HOUR_MS, "count": n}


T0 = 1_709_287_200_000  # 2024-03-01T10:00Z


def test_every_audits_verdict_is_given_beside_the_hour():
    from airflow_provider_logbus.ui.status import PageTable, page_report

    table = PageTable((audited("audit", 60), audited("daily", 120, dag_id="daily")))
    report = page_report(table, inputs([record("b", [window(0, 10)])], {T0: 10}), T0, T0 + HOUR_MS,
                         now_ms=T0 + 2 * HOUR_MS + 1, announcement=None)
    (hour,) = report["hours"]
    assert hour["display_status"] == "complete"  # the first audit's: 60 minutes of grace have passed
    assert hour["verdicts"] == [{"audit": "hourly.audit", "status": "complete"},
                                {"audit": "daily.daily", "status": "pending"}]
    assert [(a["audit"], a["status"]) for a in report["audits"]] == [("hourly.audit", "ok"), ("daily.daily", "ok")]


def test_an_hour_says_why_and_names_the_files_outside_any_batch_with_their_snapshot():
    from airflow_provider_logbus.targets.base import TableFile
    from airflow_provider_logbus.ui.status import PageTable, page_report

    files = [TableFile("wh/t/data/part-0.parquet", T0, 10, "b", 7719492545836353017),
             TableFile("wh/t/data/by-hand.parquet", T0, 1382, None, 7719492545836353099)]
    report = page_report(PageTable((audited("audit", 0),)), inputs([record("b", [window(0, 10)])], {T0: 10}, files),
                         T0, T0 + HOUR_MS, now_ms=T0 + 2 * HOUR_MS, announcement=None)
    (hour,) = report["hours"]
    assert hour["display_status"] == "duplicated"
    assert hour["outside_batches"] == [{"path": "wh/t/data/by-hand.parquet", "rows": 1382,
                                        "snapshot_id": "7719492545836353099"}]  # a string: every digit
    assert any("wh/t/data/by-hand.parquet (1382 rows)" in reason for reason in hour["reasons"])
    assert any("1382 duplicated row(s) at the table tier" in reason for reason in hour["reasons"])


def test_an_announced_hour_no_longer_complete_lowers_complete_through():
    from airflow_provider_logbus.ui.status import PageTable, page_report

    batches = [record("b", [window(0, 10), window(1, 10), window(2, 10)]), record("copy", [window(1, 10)])]
    announcement = {"complete_through_ms": T0 + 3 * HOUR_MS, "run_id": "r", "hours": []}
    report = page_report(PageTable((audited("audit", 0),)), inputs(batches, {T0: 10, T0 + HOUR_MS: 10,
                                                                             T0 + 2 * HOUR_MS: 10}),
                         T0, T0 + 3 * HOUR_MS, now_ms=T0 + 9 * HOUR_MS, announcement=announcement)
    assert report["announced_through_ms"] == T0 + 3 * HOUR_MS
    assert report["complete_through_ms"] == T0 + HOUR_MS
    assert report["withdrawn"] == [{"hour": "2024-03-01T11:00Z", "hour_ms": T0 + HOUR_MS, "status": "duplicated"}]
    after = page_report(PageTable((audited("audit", 0),)), inputs(batches[:1], {T0: 10, T0 + HOUR_MS: 10,
                                                                                 T0 + 2 * HOUR_MS: 10}),
                        T0, T0 + 3 * HOUR_MS, now_ms=T0 + 9 * HOUR_MS, announcement=announcement)
    assert after["complete_through_ms"] == T0 + 3 * HOUR_MS and after["withdrawn"] == []


def test_a_topic_only_the_brokers_count_shows_their_tier_and_waits_for_them():
    """Kafka clients publish no monitoring events: the page's hours compare the brokers'
    counts with the table, and an hour whose records the brokers have not counted yet is
    pending with the reason, never duplicated."""
    from dataclasses import replace as with_

    from broker.client.brokercounts import BrokerCounts
    from airflow_provider_logbus.ui.status import PageTable, page_report

    loaded = inputs([record("b", [window(0, 10)])], {})
    table = PageTable((audited("audit", 0),))
    counts = BrokerCounts({("web", T0): 10}, {("web", 0): 0}, {("web", 0): 100}, {("web", 0): 0})
    report = page_report(table, with_(loaded, broker=counts), T0, T0 + HOUR_MS, now_ms=T0 + 2 * HOUR_MS,
                         announcement=None)
    (hour,) = report["hours"]
    assert report["tiers"] == ["broker", "table"]
    assert [(t["tier"], t["count"]) for t in hour["tiers"]] == [("broker", 10), ("table", 10)]
    assert hour["display_status"] == "complete"
    behind = with_(counts, counts={("web", T0): 4}, upto={("web", 0): 40})
    (hour,) = page_report(table, with_(loaded, broker=behind), T0, T0 + HOUR_MS, now_ms=T0 + 2 * HOUR_MS,
                          announcement=None)["hours"]
    assert hour["display_status"] == "pending"
    assert hour["reasons"] == ["the brokers have not counted every record the table loaded yet: partition 0 "
                               "counted to 40, loaded to 100"]
