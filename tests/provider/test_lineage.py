"""OpenLineage: a real snapshot → load (spark-submit) → commit DAG run, with the
OpenLineage provider's listener writing its events to a file, reports the topic with the
exact byte ranges per partition as input and the table with the batch id as output.

The run is `dag.test()` in a child process: the OpenLineage provider reads (and caches)
its transport once per process, so this test's configuration stays out of the others'."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


from airflow_provider_logbus.cluster import LogbusCluster

from .helpers import fill_last_hour

pytest.importorskip("airflow.providers.openlineage", reason="the OpenLineage provider is an optional extra")
pytestmark = pytest.mark.slow
HOUR = 3_600_000
TOPIC = TABLE = "clicks"
MESSAGES = 40

DAG_FILE = '''
import os
from datetime import datetime, timezone

from airflow.sdk import DAG

from airflow_provider_logbus.operators.commit import LogbusCommitOperator
from airflow_provider_logbus.operators.snapshot import LogbusOffsetSnapshotOperator
from airflow_provider_logbus.operators.spark_load import LogbusSparkLoadOperator

WAREHOUSE = os.environ["LOGBUS_WAREHOUSE"]
with DAG("logbus_lineage", schedule="@hourly", start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
         catchup=False) as dag:
    (LogbusOffsetSnapshotOperator(task_id="snapshot", topic="{topic}", table="{table}", warehouse=WAREHOUSE)
     >> LogbusSparkLoadOperator(task_id="load", table="{table}", warehouse=WAREHOUSE,
                                schema="server string, n long, ts_ms long")
     >> LogbusCommitOperator(task_id="commit", table="{table}", warehouse=WAREHOUSE))
'''

RUN = '''
import importlib.util, sys
from datetime import datetime, timezone
spec = importlib.util.spec_from_file_location("logbus_lineage_dag", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
run = module.dag.test(logical_date=datetime.fromtimestamp(int(sys.argv[2]) / 1000, timezone.utc))
sys.exit(0 if str(run.state) == "success" else 1)
'''


def completed_tasks(events_file: Path) -> dict[str, dict]:
    """The COMPLETE event of each task, by task id."""
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    return {e["job"]["name"].rsplit(".", 1)[-1]: e for e in events
            if e.get("eventType") == "COMPLETE" and "." in e["job"]["name"]}


def test_load_and_commit_report_the_topics_offset_ranges_and_the_tables_batch(cluster, airflow_db, tmp_path):
    zk, start = fill_last_hour(cluster, TOPIC, MESSAGES, brokers=1)
    with LogbusCluster(zk) as c:
        ends = {p: o.latest for p, o in c.partition_offsets(TOPIC).items()}
    dags, warehouse, events = tmp_path / "dags", tmp_path / "warehouse", tmp_path / "lineage.jsonl"
    dags.mkdir()
    (dags / "logbus_lineage.py").write_text(DAG_FILE.format(topic=TOPIC, table=TABLE))
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "LOGBUS_WAREHOUSE": str(warehouse),
           "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events),
                                                                 "append": True}),
           "AIRFLOW__OPENLINEAGE__NAMESPACE": "logbus-tests"}
    # not from the checkout: its logbus.egg-info (pip's editable install) would list the logbus plugin a second
    # time, and Airflow's task runtime stops registering plugins at a duplicate (docs/provider.md, "Lineage")
    run = subprocess.run([sys.executable, "-c", RUN, str(dags / "logbus_lineage.py"), str(start + HOUR)], env=env,
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    batch_id = next(p.name for p in (warehouse / TABLE).glob("batch_id=*")).split("=", 1)[1]
    expected = [{"partition": p, "start": 0, "end": ends[p]} for p in sorted(ends)]
    tasks = completed_tasks(events)
    for task, published, rows in (("load", False, None), ("commit", True, MESSAGES)):
        (source,), (table,) = tasks[task]["inputs"], tasks[task]["outputs"]
        assert (source["namespace"], source["name"]) == (f"logbus://{zk}", TOPIC)
        ranges = source["inputFacets"]["logbusOffsetRanges"]
        assert ranges["batchId"] == batch_id
        assert sorted(ranges["ranges"], key=lambda r: r["partition"]) == expected
        assert (table["namespace"], table["name"]) == ("file", str((warehouse / TABLE).resolve()))
        batch = table["outputFacets"]["logbusBatch"]
        assert (batch["batchId"], batch["published"], batch.get("rowCount")) == (batch_id, published, rows)
        assert batch["_schemaURL"].endswith("LogbusBatchOutputFacet.json")
    assert not tasks["snapshot"]["inputs"] and not tasks["snapshot"]["outputs"]


def test_an_operator_that_loaded_nothing_reports_no_lineage():
    from airflow_provider_logbus.operators.spark_load import LogbusSparkLoadOperator

    load = LogbusSparkLoadOperator(task_id="load", table=TABLE, warehouse="/nowhere")
    assert load.get_openlineage_facets_on_complete(None) is None
