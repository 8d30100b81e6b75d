"""OpenLineage: a real snapshot → load (spark-submit) → commit reports, through the
OpenLineage provider's own extractor, the topic with the exact byte ranges per partition
as input and the table with the batch id as output."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from broker.localcluster import wait_until

from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.operators.commit import LogbusCommitOperator
from airflow_provider_logbus.operators.snapshot import LogbusOffsetSnapshotOperator
from airflow_provider_logbus.operators.spark_load import LogbusSparkLoadOperator

from .conftest import use_logbus_connection
from .helpers import FakeTaskInstance, produce

pytest.importorskip("airflow.providers.openlineage", reason="the OpenLineage provider is an optional extra")
pytestmark = pytest.mark.slow
HOUR = 3_600_000
TOPIC = TABLE = "clicks"
MESSAGES = 40


def lineage_of(operator) -> dict:
    """The lineage the OpenLineage listener would send on the task's success, as JSON."""
    from airflow.providers.openlineage.extractors.base import DefaultExtractor
    from openlineage.client.serde import Serde

    lineage = DefaultExtractor(operator).extract_on_complete(None)
    return {"inputs": [Serde.to_dict(d) for d in lineage.inputs], "outputs": [Serde.to_dict(d) for d in lineage.outputs]}


def test_load_and_commit_report_the_topics_offset_ranges_and_the_tables_batch(cluster, airflow_db, tmp_path):
    cluster.start_broker(0, {"num.partitions": 2})
    zk = cluster.zookeeper
    use_logbus_connection(zk)
    now = int(time.time() * 1000)
    start = now - now % HOUR - HOUR
    produce(zk, TOPIC, [start + i * 1000 for i in range(MESSAGES)])
    with LogbusCluster(zk) as c:
        wait_until(lambda: all(o.latest > 0 for o in c.partition_offsets(TOPIC).values()), 30, "both partitions")
    warehouse = tmp_path / "warehouse"
    interval_start = datetime.fromtimestamp(start / 1000, timezone.utc)
    plan = LogbusOffsetSnapshotOperator(task_id="snapshot", topic=TOPIC, table=TABLE, warehouse=str(warehouse)).execute(
        {"data_interval_start": interval_start, "data_interval_end": interval_start + timedelta(hours=1)})
    ti = FakeTaskInstance({"snapshot": plan})
    load = LogbusSparkLoadOperator(task_id="load", table=TABLE, warehouse=str(warehouse),
                                   schema="server string, n long, ts_ms long")
    ti.xcoms["load"] = load.execute({"ti": ti})
    commit = LogbusCommitOperator(task_id="commit", table=TABLE, warehouse=str(warehouse))
    committed = commit.execute({"ti": ti, "run_id": "lineage-test"})
    assert committed["row_count"] == MESSAGES

    spans = sorted(({k: v for k, v in r.items() if k != "topic"} for r in plan["ranges"]),
                   key=lambda r: r["partition"])
    assert {r["partition"] for r in spans} == {0, 1} and all(r["end"] > r["start"] for r in spans)
    for operator, published, rows in ((load, False, None), (commit, True, MESSAGES)):
        lineage = lineage_of(operator)
        (source,), (table,) = lineage["inputs"], lineage["outputs"]
        assert (source["namespace"], source["name"]) == (f"logbus://{zk}", TOPIC)
        ranges = source["inputFacets"]["logbusOffsetRanges"]
        assert ranges["batchId"] == plan["batch_id"]
        assert sorted(ranges["ranges"], key=lambda r: r["partition"]) == spans
        assert (table["namespace"], table["name"]) == ("file", str((warehouse / TABLE).resolve()))
        batch = table["outputFacets"]["logbusBatch"]
        assert (batch["batchId"], batch["published"], batch.get("rowCount")) == (plan["batch_id"], published, rows)
        assert batch["_schemaURL"].endswith("LogbusBatchOutputFacet.json")


def test_an_operator_that_loaded_nothing_reports_no_lineage():
    load = LogbusSparkLoadOperator(task_id="load", table=TABLE, warehouse="/nowhere")
    assert load.get_openlineage_facets_on_complete(None) is None
