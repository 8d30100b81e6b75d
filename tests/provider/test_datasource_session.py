"""The Spark data source in one Python worker: every partition the worker reads shares
one cluster handle, so a load of many partitions opens a ZooKeeper session per worker
rather than per partition (Spark reuses its Python workers across tasks)."""

from __future__ import annotations

import time

from airflow_provider_logbus.cluster import LogbusCluster
from airflow_provider_logbus.plan import Range, ranges_to_json
from airflow_provider_logbus.spark.datasource import LogbusReader, close_worker_clusters

from .helpers import produce


def test_the_partitions_a_worker_reads_share_one_zookeeper_session(cluster, sessions):
    cluster.start_broker(0, {"num.partitions": 4})
    now = int(time.time() * 1000)
    produced = produce(cluster.zookeeper, "pages", [now + i for i in range(200)], servers=1)
    with LogbusCluster(cluster.zookeeper) as handle:
        ranges = [Range("pages", p, o.earliest, o.latest) for p, o in sorted(handle.partition_offsets("pages").items())]
    assert len([r for r in ranges if r.end > r.start]) == 4
    sessions.clients.clear()  # count the reader's own

    reader = LogbusReader({"ranges": ranges_to_json(ranges), "zookeeper": cluster.zookeeper})
    try:
        partitions = reader.partitions()
        rows = [batch.num_rows for partition in partitions for batch in reader.read(partition)]
        assert len(partitions) == 4 and sum(rows) == produced
        assert len(sessions.clients) == 1
        assert sessions.clients[0].connected  # kept for the worker's next task
    finally:
        close_worker_clusters()
    assert not sessions.clients[0].connected  # closed with the worker
