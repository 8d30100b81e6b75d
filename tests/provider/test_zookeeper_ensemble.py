"""The provider against a three-server ZooKeeper ensemble with one server stopped: the
batch is snapshotted, and the ensemble's leader is stopped as the load begins (the load
job on the shared SparkSession); the load, the commit and the audit go on with two
servers. Real ZooKeeper servers, broker and Spark."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from airflow_provider_logbus.hooks.logbus import LogbusHook
from harness.cluster import LocalCluster
from harness.process import wait_until

from .helpers import produce, table_rows
from .test_audit_and_retention import VALUE_BYTES, audit, load_batch, wait_flushed

pytestmark = pytest.mark.slow
HOUR = 3_600_000
TOPIC = TABLE = "clicks"


def stop_when_loading(ensemble, leader: int, table_dir) -> None:
    """Stop the leader once the load has prepared its staging directory (the job starts next)."""
    wait_until(lambda: any(table_dir.glob("_staging/*")), 120, "the load to start", 0.02)
    ensemble.stop_server(leader)


def test_a_load_and_audit_with_one_of_three_zookeeper_servers_stopped(zookeeper_ensemble, spark, tmp_path):
    ensemble = zookeeper_ensemble
    zk = ensemble.connect_string
    start = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    end = start + timedelta(days=1)
    with LocalCluster(zk, tmp_path / "brokers", {"log.flush.interval.ms": 20, "num.partitions": 2}) as brokers:
        brokers.start_broker(0)
        t0 = int(start.timestamp() * 1000) + 10 * HOUR
        n = produce(zk, TOPIC, [t0 + i * 30_000 for i in range(120)], value_bytes=VALUE_BYTES, keyed=False,
                    one_entry_each=True)
        wait_flushed(zk, TOPIC, n)

        leader = ensemble.leader
        stopper = threading.Thread(target=stop_when_loading, args=(ensemble, leader, tmp_path / TABLE), daemon=True)
        stopper.start()
        hook = LogbusHook(zookeeper=zk)
        try:
            record = load_batch(hook, spark, tmp_path, TABLE, TOPIC, start, end)
            stopper.join(60)
            assert ensemble.servers[leader].process is None, "the leader was not stopped during the load"
            report = audit(hook, tmp_path, TABLE, start, end)
        finally:
            hook.close()
            stopper.join(60)
        assert brokers.brokers[0].alive

    rows = table_rows(tmp_path / TABLE)
    assert record["row_count"] == len(rows) == len({(r["partition"], r["offset"]) for r in rows}) == n
    assert (report["produced"], report["loaded"], report["missing"], report["duplicated"]) == (n, n, 0, 0)
    assert report["completeness"] == 1.0 and not report["offset_gaps"] and not report["data_loss"]
