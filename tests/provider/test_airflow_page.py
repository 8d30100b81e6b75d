"""The Logbus page in the Airflow UI (issues 22 and 39), in a real browser against a real
api-server: Debian's chromium driven by Playwright, Airflow on PostgreSQL with the
simple auth manager's users (an admin and a viewer), three hourly runs of the example
DAG (`airflow dags test`: real snapshot, Spark load, commit and audit, recorded in the
deployment's database) into an Iceberg table, which the example daily audit DAG audits
too (one table, two audits: one entry), real ZooKeeper and two brokers — the logbus
connection reaches ZooKeeper through a TCP proxy the last test cuts.

One scenario for the module; the tests run in order: the untouched table first, then
an hour made incomplete (its batch's snapshot rolled back) and one duplicated (a data
file added a second time outside the commit protocol) — both announced complete
before — then ZooKeeper unreachable.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_provider_logbus.cluster import LogbusCluster
from broker.client.partitioner import partition_for_key
from harness.airflow import AirflowDeployment
from harness.proxy import TcpProxy
from tests.integration.clientutil import read_topic

from .conftest import ROOT
from .helpers import produce

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(900)]

DAG_ID = "logbus_hourly_load"
DAILY_DAG_ID = "logbus_daily_audit"
TASK_ID = "audit"
TOPIC = TABLE = "web_page"
SCHEMA = "server string, n long, ts_ms long"
FIRST_HOUR = datetime(2024, 3, 1, 10, tzinfo=timezone.utc)
HOURS = 3
EVENTS_PER_HOUR = 120
# stamped just after an hour, in both partitions (`produce` keys message i by str(i): keys 120..125 hash to
# partitions 0,0,0,0,1,1): the sensor's sign that the hour is over; the hour's batch loads them too
NEXT_HOUR_EVENTS = 6
HOUR_MS = 3_600_000
USERS = {"admin": ("admin", "admin-pw"), "viewer": ("viewer", "viewer-pw")}
CHROMIUM = "/usr/bin/chromium"


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def hour_label(hour: int) -> str:
    return f"{FIRST_HOUR + timedelta(hours=hour):%Y-%m-%dT%H:%MZ}"


@pytest.fixture(scope="module")
def page_scenario(request, module_cluster, postgres, tmp_path_factory):
    keys = {partition_for_key(str(i).encode(), 2) for i in range(EVENTS_PER_HOUR, EVENTS_PER_HOUR + NEXT_HOUR_EVENTS)}
    assert keys == {0, 1}, "the next hour's first events must reach both partitions, or the sensor waits for ever"
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed: run `make system-deps`")
    host, _, rest = module_cluster.zookeeper.partition(":")
    port, _, chroot = rest.partition("/")
    proxy = TcpProxy((host, int(port)))
    zookeeper = f"{proxy.address}/{chroot}"
    warehouse = tmp_path_factory.mktemp("page-warehouse")
    dags = tmp_path_factory.mktemp("page-dags")
    for dag_id in (DAG_ID, DAILY_DAG_ID):
        shutil.copy(ROOT / "dags" / "examples" / f"{dag_id}.py", dags)
    env = {
        "LOGBUS_TARGET": "iceberg", "LOGBUS_TOPIC": TOPIC, "LOGBUS_TABLE": TABLE, "LOGBUS_WAREHOUSE": str(warehouse),
        "LOGBUS_GROUP": "page_loader", "LOGBUS_SENSOR_GRACE_MINUTES": "0", "LOGBUS_AUDIT_GRACE_MINUTES": "0",
        "LOGBUS_VALUE_SCHEMA": SCHEMA, "AIRFLOW__LOGBUS__UI_CACHE_SECONDS": "0",
        "AIRFLOW_CONN_LOGBUS_DEFAULT": json.dumps({"conn_type": "logbus", "extra": {"zookeeper": zookeeper}}),
        "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    deployment = AirflowDeployment(tmp_path_factory.mktemp("page-airflow"), postgres.create_database("airflow_page"),
                                   dags, env, parallelism=2, users=USERS)
    try:
        deployment.start()
        deployment.wait_for_dag(DAG_ID)
        deployment.wait_for_dag(DAILY_DAG_ID)
        for hour in range(HOURS):  # as web servers would: an hour's events, the next hour's first ones, its run
            start = ms(FIRST_HOUR + timedelta(hours=hour))
            produce(zookeeper, TOPIC, [start + i * (HOUR_MS // EVENTS_PER_HOUR) for i in range(EVENTS_PER_HOUR)]
                    + [start + HOUR_MS + 1000 * i for i in range(NEXT_HOUR_EVENTS)])
            # the run of interval [hour, hour + 1): its logical date is the interval's end
            deployment.cli("dags", "test", DAG_ID, (FIRST_HOUR + timedelta(hours=hour + 1)).isoformat(), timeout=420)
        audits = {json.loads(p.read_text())["start"]: json.loads(p.read_text())
                  for p in (warehouse / "_audit").rglob("*.json")}
        yield {"deployment": deployment, "warehouse": warehouse, "audits": audits, "proxy": proxy,
               "zookeeper": zookeeper}
    except BaseException:
        sys.stderr.write(deployment.log_tails(80))
        raise
    finally:
        deployment.stop()
        proxy.close()


@pytest.fixture(scope="module")
def browser(page_scenario):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def logged_in(browser, deployment: AirflowDeployment, username: str = "viewer"):
    """A browser page with the user's JWT in the cookie the Airflow UI keeps it in."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_cookies([{"name": "_token", "value": deployment.token(username), "url": deployment.api_url}])
    return context.new_page()


def page_url(deployment: AirflowDeployment) -> str:
    end = FIRST_HOUR + timedelta(hours=HOURS)
    return (f"{deployment.api_url}/logbus/?table={DAG_ID}.{TASK_ID}"
            f"&start={FIRST_HOUR:%Y-%m-%dT%H:%M}Z&end={end:%Y-%m-%dT%H:%M}Z")


def open_page(browser, scenario, screenshot: Path):
    page = logged_in(browser, scenario["deployment"])
    page.goto(page_url(scenario["deployment"]))
    page.wait_for_selector("#grid .cell", timeout=120_000)
    page.wait_for_selector("#lag tr[data-partition]", timeout=60_000)
    page.screenshot(path=str(screenshot), full_page=True)
    assert_png(screenshot)
    return page


def cells(page) -> dict[str, dict]:
    return {c.get_attribute("data-hour"): {k: c.get_attribute(f"data-{k}") for k in (
        "status", "produced", "loaded", "rejected", "missing", "duplicated")}
        for c in page.query_selector_all("#grid .cell")}


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000, f"{path}: not a screenshot of a page"


def api_get(deployment: AirflowDeployment, path: str, token: str | None) -> tuple[int, object]:
    request = urllib.request.Request(f"{deployment.api_url}{path}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def test_the_page_is_in_the_navigation(browser, page_scenario, tmp_path):
    page = logged_in(browser, page_scenario["deployment"])
    page.goto(page_scenario["deployment"].api_url + "/")
    page.get_by_role("button", name="Browse").click()
    link = page.get_by_role("menuitem", name="Logbus")
    link.wait_for(timeout=30_000)
    link.click()
    page.wait_for_url("**/plugin/logbus", timeout=30_000)
    frame = page.frame_locator("iframe")
    frame.locator("#table option").first.wait_for(state="attached", timeout=60_000)
    page.screenshot(path=str(tmp_path / "navigation.png"), full_page=True)
    assert_png(tmp_path / "navigation.png")


def test_anonymous_requests_are_refused_and_a_viewer_sees_the_tables(page_scenario):
    deployment = page_scenario["deployment"]
    for path in ("/logbus/", "/logbus/api/tables", f"/logbus/api/tables/{DAG_ID}/{TASK_ID}/lag"):
        status, _ = api_get(deployment, path, None)
        assert status in (401, 403), path
    status, answer = api_get(deployment, "/logbus/api/tables", deployment.token("viewer"))
    assert status == 200
    assert [(t["dag_id"], t["task_id"], t["table"], t["topic"], t["target"]) for t in answer["tables"]] == [
        (DAG_ID, TASK_ID, TABLE, TOPIC, "iceberg")]  # one entry for the table both DAGs audit
    assert [a["key"] for a in answer["tables"][0]["audits"]] == [f"{DAG_ID}.{TASK_ID}", f"{DAILY_DAG_ID}.{TASK_ID}"]


def test_the_grid_shows_the_audits_numbers(browser, page_scenario, tmp_path):
    page = open_page(browser, page_scenario, tmp_path / "complete.png")
    shown = cells(page)
    assert sorted(shown) == [hour_label(h) for h in range(HOURS)]
    for hour in range(HOURS):
        audited = page_scenario["audits"][hour_label(hour)]["hours"][0]
        assert shown[hour_label(hour)] == {
            "status": "complete", "produced": str(audited["produced"]), "loaded": str(audited["loaded"]),
            "rejected": str(audited["rejected"]), "missing": "0", "duplicated": "0"}
        assert audited["produced"] == EVENTS_PER_HOUR + (NEXT_HOUR_EVENTS if hour else 0)
    through = int(page.get_attribute("#watermark", "data-complete-through"))
    assert through == ms(FIRST_HOUR + timedelta(hours=HOURS))  # every audit announced its hour


def test_the_lag_matches_the_brokers_offsets(browser, page_scenario, tmp_path):
    from airflow_provider_logbus.targets.iceberg import IcebergTarget

    produce(page_scenario["zookeeper"], TOPIC, [ms(datetime.now(timezone.utc))] * 6)  # not loaded yet
    page = open_page(browser, page_scenario, tmp_path / "lag.png")
    rows = {int(r.get_attribute("data-partition")): (int(r.get_attribute("data-committed")),
                                                      int(r.get_attribute("data-latest")),
                                                      int(r.get_attribute("data-lag-records")))
            for r in page.query_selector_all("#lag tr[data-partition]")}
    target = IcebergTarget(TABLE, warehouse=str(page_scenario["warehouse"]))
    try:
        ends = target.state().ends
    finally:
        target.close()
    with LogbusCluster(page_scenario["zookeeper"]) as cluster:
        latest = {p: cluster.latest(TOPIC, p) for p in cluster.partitions(TOPIC)}
    records = read_topic(page_scenario["zookeeper"], TOPIC)  # the lag in records, counted by reading them
    assert rows == {p: (ends[(TOPIC, p)], latest[p],
                        sum(1 for m in records[p] if ends[(TOPIC, p)] <= m.offset < latest[p])) for p in latest}
    assert sum(lag for _, _, lag in rows.values()) >= 6  # at least the events produced above: records, not bytes
    behind = [r.query_selector_all("td")[5].inner_text() for r in page.query_selector_all("#lag tr[data-partition]")
              if r.get_attribute("data-lag-records") != "0"]
    assert behind and all(re.fullmatch(r"\d+\.\d d", text) for text in behind), behind  # loaded through 2024: days


def test_the_run_link_opens_the_run_that_loaded_the_hour(browser, page_scenario, tmp_path):
    from airflow_provider_logbus.targets.iceberg import IcebergTarget

    deployment = page_scenario["deployment"]
    page = open_page(browser, page_scenario, tmp_path / "hour.png")
    page.click(f'#grid .cell[data-hour="{hour_label(1)}"]')
    page.wait_for_selector("#batches tr[data-batch-id]")
    batches = page.query_selector_all("#batches tr[data-batch-id]")  # the last hour's run loaded its first events
    assert [int(b.query_selector_all("td")[4].inner_text()) for b in batches] == [NEXT_HOUR_EVENTS, EVENTS_PER_HOUR]
    row = batches[1]
    run_id = row.query_selector("a.run-link").inner_text()
    href = row.query_selector("a.run-link").get_attribute("href")
    assert href == f"/dags/{DAG_ID}/runs/{urllib.request.quote(run_id, safe='')}"
    status, run = api_get(deployment, f"/api/v2/dags/{DAG_ID}/dagRuns/{urllib.request.quote(run_id, safe='')}",
                          deployment.token("admin"))
    assert status == 200 and run["data_interval_start"].startswith(f"{FIRST_HOUR + timedelta(hours=1):%Y-%m-%dT%H}")
    ranges = row.query_selector_all("td")[3].inner_text()
    assert ranges.startswith("p0 [") or ranges.startswith("p1 [")
    snapshot = int(row.query_selector_all("td")[2].inner_text())  # the Iceberg snapshot id, every digit of it
    target = IcebergTarget(TABLE, warehouse=str(page_scenario["warehouse"]))
    try:
        assert snapshot == target.batch(row.get_attribute("data-batch-id")).extra["snapshot_id"]
    finally:
        target.close()
    page.click("a.run-link")
    page.wait_for_url(f"**/dags/{DAG_ID}/runs/**", timeout=30_000)


def test_an_incomplete_and_a_duplicated_hour_turn_so(browser, page_scenario, tmp_path):
    from pyiceberg.table.snapshots import ancestors_of

    from airflow_provider_logbus.targets.iceberg import IcebergTarget
    from airflow_provider_logbus.targets.iceberg_tables import local_path

    target = IcebergTarget(TABLE, warehouse=str(page_scenario["warehouse"]))
    try:
        table = target.table_or_fail()
        chain = list(ancestors_of(table.current_snapshot(), table.metadata))  # newest first
        last_batch = next(s for s in chain if "logbus.batch-id" in (s.summary.additional_properties or {}))
        with table.manage_snapshots() as snapshots:  # the last hour's batch is gone, records and rows
            snapshots.rollback_to_snapshot(last_batch.parent_snapshot_id)
        table = target.table_or_fail()
        batch = next(r.batch_id for r in target.batches() if r.interval_start.startswith(hour_label(1)[:13]))
        second = [f for f in target.contents().files
                  if f.hour_ms == ms(FIRST_HOUR + timedelta(hours=1)) and f.batch_id == batch and f.rows > 0]
        copy = Path(local_path(second[0].path)).with_name("copied-by-hand.parquet")
        shutil.copy(local_path(second[0].path), copy)
        with table.transaction() as tx:  # the same rows a second time, outside the commit protocol
            tx.add_files([str(copy)])
        added_by = target.table_or_fail().current_snapshot().snapshot_id
    finally:
        target.close()
    page = open_page(browser, page_scenario, tmp_path / "broken.png")
    shown = cells(page)
    assert shown[hour_label(0)]["status"] == "complete"
    assert shown[hour_label(1)]["status"] == "duplicated" and int(shown[hour_label(1)]["duplicated"]) > 0
    produced = EVENTS_PER_HOUR + NEXT_HOUR_EVENTS  # the previous run's batch still holds the first events
    assert shown[hour_label(2)] == {"status": "incomplete", "produced": str(produced), "loaded": str(NEXT_HOUR_EVENTS),
                                    "rejected": "0", "missing": str(EVENTS_PER_HOUR), "duplicated": "0"}

    # both hours had been announced complete: "complete through" falls back to the first, and the page says so
    assert int(page.get_attribute("#watermark", "data-complete-through")) == ms(FIRST_HOUR + timedelta(hours=1))
    assert int(page.get_attribute("#watermark", "data-announced-through")) == ms(FIRST_HOUR + timedelta(hours=HOURS))
    assert page.is_visible("#withdrawn")
    assert page.get_attribute("#withdrawn", "data-hours") == f"{hour_label(1)} {hour_label(2)}"
    assert "(duplicated)" in page.inner_text("#withdrawn") and "(incomplete)" in page.inner_text("#withdrawn")

    # the hour says why, and which file no batch published, with its rows and the snapshot that added it
    page.click(f'#grid .cell[data-hour="{hour_label(1)}"]')
    page.wait_for_selector("#outside tr[data-path]")
    (outside,) = page.query_selector_all("#outside tr[data-path]")
    assert (outside.get_attribute("data-path"), int(outside.get_attribute("data-rows"))) == (str(copy), second[0].rows)
    reasons = page.inner_text("#hour-reasons")
    assert f"{copy} ({second[0].rows} rows)" in reasons and "duplicated row(s) at the table tier" in reasons
    assert {r.get_attribute("data-audit"): r.get_attribute("data-status")
            for r in page.query_selector_all("#verdicts tr[data-audit]")} == {
        f"{DAG_ID}.{TASK_ID}": "duplicated", f"{DAILY_DAG_ID}.{TASK_ID}": "duplicated"}
    outside.query_selector("a.snapshot-link").click()
    page.wait_for_selector("#snapshot-summary tr[data-key]")
    assert page.inner_text("#snapshot h3") == f"Snapshot {added_by}"  # every digit of Iceberg's id
    summary = {r.get_attribute("data-key"): r.query_selector_all("td")[1].inner_text()
               for r in page.query_selector_all("#snapshot-summary tr[data-key]")}
    assert summary["added-records"] == str(second[0].rows) and "logbus.batch-id" not in summary
    assert "not a logbus batch" in page.inner_text("#snapshot")
    page.screenshot(path=str(tmp_path / "broken-hour.png"), full_page=True)  # docs/logbus-page.png is this one


def test_zookeeper_unreachable_shows_the_error_and_airflow_goes_on(browser, page_scenario, tmp_path):
    deployment = page_scenario["deployment"]
    page_scenario["proxy"].cut()
    page = logged_in(browser, deployment)
    page.goto(page_url(deployment))
    page.wait_for_selector("#message.error", timeout=120_000)
    text = page.inner_text("#message")
    assert text.startswith("Cannot reach the logbus cluster (ZooKeeper or brokers)"), text
    assert "Traceback" not in text
    page.screenshot(path=str(tmp_path / "error.png"), full_page=True)
    assert_png(tmp_path / "error.png")
    health = deployment.health()
    assert health and health["metadatabase"]["status"] == "healthy"
    status, dags = api_get(deployment, "/api/v2/dags", deployment.token("viewer"))
    assert status == 200 and DAG_ID in [d["dag_id"] for d in dags["dags"]]
    deployment.check_alive()  # raises naming a component that exited
