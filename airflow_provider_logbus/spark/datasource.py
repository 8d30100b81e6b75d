"""The Spark Python data source `logbus`: reads fixed byte ranges of partitions.

    spark.dataSource.register(LogbusDataSource)
    df = (spark.read.format("logbus")
          .option("ranges", json.dumps([{"topic": "t", "partition": 0, "start": 0, "end": 4096}]))
          .option("zookeeper", "127.0.0.1:2181/logbus")      # or .option("brokers", "h:p,h:p")
          .load())

Columns: topic string, partition int, offset long, timestamp timestamp (UTC, from the
producer's milliseconds), key binary, headers array<struct<key: string, value: binary>>
(a Kafka record's headers, typed as Spark's Kafka source types them; an empty list for a
message without: `broker/common/columns_arrow.py`), value binary.

A partition without a reachable leader (its broker restarting, a leadership moving) is
waited for up to `leader_wait` seconds (default `LOAD_LEADER_WAIT_S`, 60) before the read
fails naming it; the executor's log says which partition it waits for.

One Spark input partition per range; a range larger than `split_bytes` (default 256 MiB)
is split at its partition's segment starts, which the broker names cheaply with
OFFSETS(time) (segment starts are message boundaries; no other boundary is known without
reading the bytes). `read()` fetches with large fetches (`fetch_bytes`, default 8 MiB)
and yields one pyarrow RecordBatch per fetch, built with a header walk and numpy gathers,
never one Python row per message. Every partition a Python worker reads shares one
cluster handle (`worker_cluster`): one ZooKeeper session and one connection per broker
per worker, not per Spark partition.

With the option `json_value` (a Spark struct's `.json()`: the load job's value schema),
the reader also parses the values as JSON with pyarrow where pyarrow's answer is
Spark's, in one more column (`reader_json.PARSED_IN_READER`, null where Spark's
`from_json` must parse), and drops the bytes of values nothing needs any more
(`json_required`: top-level required fields, JSON list; `json_keep_values`: "true"
keeps every value). `spark/reader_json.py` says when pyarrow's answer is used; a schema
with a type it leaves to Spark adds no column.
"""

from __future__ import annotations

import atexit
import json
import os
from typing import TYPE_CHECKING, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from broker.common.columns_arrow import decode_arrow
from broker.common.errors import InvalidMessage

from airflow_provider_logbus.cluster import LOAD_LEADER_WAIT_S, leader_wait_seconds
from airflow_provider_logbus.plan import Range, ranges_from_json
from airflow_provider_logbus.spark.reader_json import PARSED_IN_READER, arrow_value_type, parse_values, \
    spark_parsed_type

if TYPE_CHECKING:
    from airflow_provider_logbus.cluster import LogbusCluster

_worker_clusters: dict[tuple, "LogbusCluster"] = {}


def worker_cluster(zookeeper: str | None, brokers: str | None,
                   leader_wait: float = LOAD_LEADER_WAIT_S, security: str | None = None) -> "LogbusCluster":
    """The cluster handle of this Python worker, for every partition it reads: Spark
    reuses a Python worker for the next task (`spark.python.worker.reuse`, on by
    default), so a load of many partitions opens a ZooKeeper session and broker
    connections per worker, not per partition. Keyed by pid too, so that a forked copy
    never shares a parent's session. Closed when the worker exits; a worker Spark kills
    leaves its session to ZooKeeper's timeout."""
    from airflow_provider_logbus.cluster import LogbusCluster

    key = (os.getpid(), zookeeper, brokers, leader_wait, security)
    cluster = _worker_clusters.get(key)
    if cluster is None:
        if not _worker_clusters:
            atexit.register(close_worker_clusters)
        cluster = _worker_clusters[key] = LogbusCluster(zookeeper=zookeeper, brokers=brokers,
                                                        leader_wait=leader_wait, security=client_security(security))
    return cluster


def client_security(properties: str | None):
    """The `security` option (JSON properties) as a `ClientSecurity`; plaintext if absent."""
    from broker.client.security import OPEN, ClientSecurity

    return ClientSecurity.from_properties(json.loads(properties)) if properties else OPEN


def close_worker_clusters() -> None:
    while _worker_clusters:
        key, cluster = _worker_clusters.popitem()
        if key[0] == os.getpid():
            cluster.close()


class RangePartition(InputPartition):
    """One Spark input partition: a `Range` whose `end` is a message boundary."""

    def __init__(self, span: Range) -> None:
        self.span = span
        super().__init__(json.dumps(span.to_dict()))


class LogbusDataSource(DataSource):
    """Options: `ranges` (JSON list of {topic, partition, start, end}), `zookeeper` or
    `brokers`, optional `fetch_bytes`, `split_bytes`, `verify_crc` ("true"),
    `leader_wait` (seconds, `LOAD_LEADER_WAIT_S`)."""

    @classmethod
    def name(cls) -> str:
        return "logbus"

    def schema(self):
        from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField,
                                       StructType, TimestampType)

        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        columns = [StructField("topic", StringType()), StructField("partition", IntegerType()),
                   StructField("offset", LongType()), StructField("timestamp", TimestampType()),
                   StructField("key", BinaryType()), StructField("headers", ArrayType(header)),
                   StructField("value", BinaryType())]
        value = self.options.get("json_value")
        if value and arrow_value_type(value) is not None:  # else Spark's from_json parses every value
            columns.append(StructField(PARSED_IN_READER, spark_parsed_type(value), True))
        return StructType(columns)

    def reader(self, schema) -> "LogbusReader":
        return LogbusReader(dict(self.options))


class LogbusReader(DataSourceReader):
    def __init__(self, options: dict) -> None:
        if "ranges" not in options:
            raise ValueError("the logbus data source needs option 'ranges' (JSON list of {topic, partition, start, end})")
        self.ranges = ranges_from_json(options["ranges"])
        self.zookeeper = options.get("zookeeper") or None
        self.brokers = options.get("brokers") or None
        if not self.zookeeper and not self.brokers:
            raise ValueError("the logbus data source needs option 'zookeeper' or 'brokers'")
        self.fetch_bytes = int(options.get("fetch_bytes", 8 << 20))
        self.split_bytes = int(options.get("split_bytes", 256 << 20))
        self.verify_crc = str(options.get("verify_crc", "true")).lower() == "true"
        self.leader_wait = leader_wait_seconds(options.get("leader_wait", LOAD_LEADER_WAIT_S))
        self.security = options.get("security") or None
        client_security(self.security)  # bad settings fail at planning, on the driver
        self.json_value = options.get("json_value") or None
        self.json_required = json.loads(options.get("json_required") or "[]")
        self.json_keep_values = str(options.get("json_keep_values", "false")).lower() == "true"

    def _cluster(self):
        from airflow_provider_logbus.cluster import LogbusCluster

        return LogbusCluster(zookeeper=self.zookeeper, brokers=self.brokers, leader_wait=self.leader_wait,
                             security=client_security(self.security))

    def partitions(self) -> list[RangePartition]:
        spans: list[Range] = []
        needs_split = [r for r in self.ranges if r.end - r.start > self.split_bytes]
        starts_cache: dict[tuple[str, int], list[int]] = {}
        cluster = self._cluster() if needs_split else None
        try:
            for r in self.ranges:
                if r.end <= r.start:
                    continue
                cuts = [r.start]
                if r.end - r.start > self.split_bytes and cluster is not None:
                    if r.key not in starts_cache:
                        starts_cache[r.key] = cluster.segment_starts(r.topic, r.partition)
                    for boundary in starts_cache[r.key]:
                        if r.start < boundary < r.end and boundary - cuts[-1] >= self.split_bytes // 2:
                            cuts.append(boundary)
                cuts.append(r.end)
                spans += [Range(r.topic, r.partition, a, b) for a, b in zip(cuts, cuts[1:])]
        finally:
            if cluster is not None:
                cluster.close()
        if not spans:  # Spark needs at least one partition; an empty one reads nothing
            spans.append(Range("", 0, 0, 0))
        return [RangePartition(span) for span in spans]

    def read(self, partition: RangePartition) -> Iterator:
        r = partition.span
        if r.end <= r.start:
            return
        cluster = worker_cluster(self.zookeeper, self.brokers, self.leader_wait, self.security)
        value_type = arrow_value_type(self.json_value) if self.json_value else None
        for base, buf in cluster.read_range(r.topic, r.partition, r.start, r.end, self.fetch_bytes):
            try:
                batch = decode_arrow(r.topic, r.partition, base, buf, self.verify_crc)
            except InvalidMessage as exc:
                raise InvalidMessage(f"{exc}; the batch cannot be loaded past it (docs/operations.md, storage "
                                     "faults)") from None
            yield batch if value_type is None else self._with_parsed(batch, value_type)

    def _with_parsed(self, batch, value_type):
        import pyarrow as pa

        parsed, values = parse_values(batch.column("value"), value_type, self.json_required, self.json_keep_values)
        return pa.RecordBatch.from_arrays([*batch.columns[:-1], values, parsed],
                                          names=[*batch.schema.names[:-1], "value", PARSED_IN_READER])
