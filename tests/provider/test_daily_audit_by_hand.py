"""Auditing a given day by hand, as docs/provider.md says: Airflow 3's `airflow dags test
logbus_daily_audit <date>` creates a manual run whose data interval *ends* at that date,
so it audits the day before; the audit says which interval it audits in the first line
the task logs. The real `airflow` command, a real cluster, a directory table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from .conftest import use_logbus_connection
from .helpers import produce, yesterday_start

pytestmark = pytest.mark.slow
TOPIC = TABLE = "audited_by_hand"
TASK_START = "::endgroup::"  # Airflow closes the task's pre-execution log group: the task's own lines follow


def task_lines(output: str) -> list[str]:
    """The lines the task logged once it started executing (`airflow dags test` prints them)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if TASK_START in line)
    return [line for line in lines[start + 1:] if line.strip()]


def test_dags_test_of_a_date_audits_the_day_before_and_logs_that_interval_first(module_cluster, airflow_db,
                                                                                  tmp_path):
    zk = module_cluster.zookeeper
    produce(zk, TOPIC, [int(time.time() * 1000)] * 4)  # today's: the audited day holds nothing
    use_logbus_connection(zk)
    day = yesterday_start()
    logical_date = day + timedelta(days=1)  # the date a user types to audit `day`
    env = {**os.environ, "LOGBUS_TARGET": "directory", "LOGBUS_TABLE": TABLE, "LOGBUS_TOPIC": TOPIC,
           "LOGBUS_WAREHOUSE": str(tmp_path), "LOGBUS_DAILY_AUDIT_GRACE_MINUTES": "0"}
    done = subprocess.run([str(Path(sys.executable).parent / "airflow"), "dags", "test", "logbus_daily_audit",
                           logical_date.strftime("%Y-%m-%d")], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:]
    first = task_lines(done.stdout)[0]
    assert f"auditing table {TABLE!r} against topic {TOPIC!r} for {day:%Y-%m-%dT%H:%MZ} .. " \
           f"{logical_date:%Y-%m-%dT%H:%MZ}" in first, first
    (report,) = (tmp_path / "_audit" / TABLE).glob("*.json")
    assert report.name == f"{day:%Y%m%dT%H%M%S}_{logical_date:%Y%m%dT%H%M%S}.json"
    assert json.loads(report.read_text())["start"] == f"{day:%Y-%m-%dT%H:%MZ}"
