"""Producing test data with the real clients, and reading it back."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

from broker.client.producer import Producer
from broker.client.security import OPEN, ClientSecurity
from broker.common.message import Message, iter_messages, scan

from airflow_provider_logbus.cluster import LogbusCluster

from .fixtures.pre_record_offsets import PRODUCERS as BATCHED_AND_COMPRESSED  # messages sharing entries


def produce(zookeeper: str, topic: str, timestamps: list[int], servers: int = 3, value_bytes: int | None = None,
            keyed: bool = True, one_entry_each: bool = True, security: ClientSecurity = OPEN,
            settings: list[dict] | None = None) -> int:
    """Send one JSON event per timestamp, round-robin over `servers` producers (each with
    monitoring events on). With `value_bytes`, every value has exactly that size. With
    `one_entry_each` (the default) every message is an entry of its own (idempotence
    off); else messages share entries (producer batches). `settings` gives each producer
    its own `Producer` options instead (one producer each: `BATCHED_AND_COMPRESSED`)."""
    settings = settings or [{"enable_idempotence": not one_entry_each}] * servers
    servers = len(settings)
    producers = [Producer(zookeeper=zookeeper, acks=1, monitoring=True, security=security, **options)
                 for options in settings]
    try:
        for i, ts in enumerate(timestamps):
            body = {"server": f"web-{i % servers}", "n": i, "ts_ms": ts}
            value = json.dumps(body).encode()
            if value_bytes is not None:
                value = json.dumps({**body, "pad": "x" * (value_bytes - len(value) - 12)}).encode()
                value = value + b" " * (value_bytes - len(value))
                assert len(value) == value_bytes
            producers[i % servers].send(topic, value, key=(str(i) if keyed else None), timestamp=ts)
    finally:
        reports = [p.close() for p in producers]
    failed = [f for r in reports if r is not None for f in r.failed]
    assert not failed, failed
    return len(timestamps)


def all_offsets(zookeeper: str, topic: str, security: ClientSecurity = OPEN) -> set[tuple[int, int]]:
    """(partition, offset) of every message now in the topic."""
    return {(p, m.offset) for p, m in all_messages(zookeeper, topic, security)}


def all_messages(zookeeper: str, topic: str, security: ClientSecurity = OPEN) -> list[tuple[int, Message]]:
    """(partition, message) of every message now in the topic, as a native consumer
    reads them (`iter_messages`)."""
    out = []
    with LogbusCluster(zookeeper, security=security) as cluster:
        for p, o in cluster.partition_offsets(topic).items():
            for base, buf in cluster.read_range(topic, p, o.earliest, o.latest):
                out += [(p, m) for m in iter_messages(buf, base)]
    return out


def entry_kinds(zookeeper: str, topic: str) -> dict[str, int]:
    """How the topic's messages are stored: its entries, and how many of them are
    compressed sets or producer batches (`scan` of every partition)."""
    out = {"entries": 0, "compressed": 0, "batches": 0}
    with LogbusCluster(zookeeper) as cluster:
        for p, o in cluster.partition_offsets(topic).items():
            for _, buf in cluster.read_range(topic, p, o.earliest, o.latest):
                found = scan(buf)
                out = {"entries": out["entries"] + found.count, "compressed": out["compressed"] + found.compressed,
                       "batches": out["batches"] + found.batches}
    return out


def table_rows(table_dir) -> list[dict]:
    import pyarrow.dataset as ds

    if not any(table_dir.glob("batch_id=*/**/*.parquet")):
        return []
    return ds.dataset(str(table_dir), format="parquet", partitioning="hive").to_table(
        columns=["partition", "offset", "batch_id"]).to_pylist()


class FakeTaskInstance:
    """What an operator's `execute()` asks of `context["ti"]`: earlier tasks' XComs and
    the try number, for running operators in-process without a scheduler."""

    def __init__(self, xcoms: dict[str, dict]) -> None:
        self.xcoms, self.try_number = xcoms, 1

    def xcom_pull(self, task_ids: str) -> dict | None:
        return self.xcoms.get(task_ids)


HOUR_MS = 3_600_000


def fill_last_hour(cluster, topic: str, messages: int, brokers: int = 2) -> tuple[str, int]:
    """Start `brokers` brokers of 2 partitions each, point the logbus connection at
    them and produce `messages` messages one second apart from the start of the last
    whole hour, waiting until every partition has data; (ZooKeeper connect string, that
    hour's start in ms)."""
    from harness.process import wait_until

    from .conftest import use_logbus_connection

    for broker_id in range(brokers):
        cluster.start_broker(broker_id, {"num.partitions": 2})
    zk = cluster.zookeeper
    use_logbus_connection(zk)
    now = int(time.time() * 1000)
    start = now - now % HOUR_MS - HOUR_MS
    produce(zk, topic, [start + i * 1000 for i in range(messages)])
    with LogbusCluster(zk) as c:
        wait_until(lambda: all(o.latest > 0 for o in c.partition_offsets(topic).values()), 30, "every partition")
    return zk, start



def yesterday_start() -> datetime:
    """00:00 UTC of yesterday: a whole day in the past, whatever the time of the run."""
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=1)


def produce_unloaded(zookeeper: str, topic: str, timestamps: list[int]) -> None:
    """Produce messages no load will pick up before the next audit, and wait until the
    producers' monitoring events count them (what the audit compares with)."""
    from harness.process import wait_until

    from broker.client.monitoring import sum_counts

    def counted() -> int:
        with LogbusCluster(zookeeper) as c:
            return sum(w.count for (t, _), w in sum_counts(c.monitoring_events()).items() if t == topic)

    before = counted()
    produce(zookeeper, topic, timestamps)
    wait_until(lambda: counted() == before + len(timestamps), 30, "the monitoring events of the new messages")


def run_daily_audit(env: dict[str, str], day_start: datetime) -> tuple[str, dict]:
    """Run the example daily audit DAG (`dag.test()`) over the UTC day from `day_start`,
    configured by `env` as the hourly load was; (the run's state, the report it kept)."""
    from .conftest import load_dag

    end = day_start + timedelta(days=1)
    dag = load_dag("logbus_daily_audit.py", env)
    run = dag.test(logical_date=end)
    (report,) = Path(env["LOGBUS_WAREHOUSE"], "_audit").glob(f"*/{day_start:%Y%m%dT%H%M%S}_{end:%Y%m%dT%H%M%S}.json")
    return str(run.state), json.loads(report.read_text())


@contextmanager
def process_output(path: Path) -> Iterator[Path]:
    """What this process and its children print and log meanwhile, into `path` too:
    `dag.test()` runs tasks in this process and prints or logs their output (spark-submit's
    included) rather than writing task log files. Three doors, all watched: the file
    descriptors 1 and 2 (children), `sys.stdout`/`sys.stderr` (pytest points them at its
    own buffers), and the root logger."""
    import logging
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds, saved_streams = [os.dup(1), os.dup(2)], (sys.stdout, sys.stderr)
    sink = open(path, "a", buffering=1, errors="replace")
    handler = logging.StreamHandler(sink)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    sys.stdout = sys.stderr = sink
    logging.getLogger().addHandler(handler)
    try:
        yield path
    finally:
        logging.getLogger().removeHandler(handler)
        sys.stdout, sys.stderr = saved_streams
        sink.close()
        for fd, copy in zip((1, 2), saved_fds):
            os.dup2(copy, fd)
            os.close(copy)


def produce_values(zookeeper: str, topic: str, values: list[bytes], timestamp: int) -> None:
    """Each of `values` as a message of its own (keys "0", "1", ...), stamped from
    `timestamp` on, with monitoring events as the web servers send them."""
    producer = Producer(zookeeper=zookeeper, acks=1, monitoring=True, enable_idempotence=False)
    try:
        for i, value in enumerate(values):
            producer.send(topic, value, key=str(i), timestamp=timestamp + i)
    finally:
        assert not producer.close().failed
