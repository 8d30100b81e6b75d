"""`make demo`: from nothing to an audited Apache Iceberg table, through the Kafka paper's
pipeline (section 4, Figure 3).

Starts ZooKeeper and three clusters under their own chroots (harness.zookeeper,
harness.cluster): one broker in each "live" datacenter (east, west) and two in the
"offline" one, whose topics are replicated on both (`default.replication.factor=2`, as the
example broker properties set it). Web servers in both live datacenters produce a few
hours of JSON activity (timestamps over the past hours, monitoring events on, the
idempotent producer); `logbus mirror` pulls the topic and the monitoring events into the
offline cluster. While they produce, the east broker is paused past the producers'
timeout once (they retry; idempotence keeps the retries out of the log) and the mirror
is killed with SIGKILL once (restarted, it resumes from its checkpoint without
duplicates). Then it runs the example hourly DAG against the offline cluster for each hour with `airflow dags test`
(temporary AIRFLOW_HOME, SQLite, `airflow db migrate`) into an Iceberg table on an
embedded SQLite catalog (or Parquet directories with `--target directory`), audits the
same hours at every tier (produced, mirrored, loaded), prints them per hour and the table's snapshots
with their batch ids and offset ranges, and stops everything, also on failure. The
example DAGs read their configuration from the LOGBUS_* variables set here, through
`airflow_provider_logbus.examples.config`, which the demo's own audit reads too. Times are
printed as ISO-8601 UTC; the output holds no Python warnings (tests/provider/test_demo.py).

    .venv/bin/python demo/run_demo.py [--hours 3] [--rate 2000] [--target iceberg] [--seed N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import threading
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from airflow_provider_logbus.completeness import utc_minute  # noqa: E402
from harness.cluster import LocalCluster  # noqa: E402
from harness.zookeeper import ZooKeeperServer, with_chroot  # noqa: E402

HOUR_MS = 3_600_000
BROKER_SETTINGS = {"log.flush.interval.ms": 50, "num.partitions": 4, "default.replication.factor": 2}
LIVE_SETTINGS = {"log.flush.interval.ms": 50, "num.partitions": 4}
MONITORING_TOPIC = "_logbus_monitoring"
MIRROR = "demo"
PAUSE_SECONDS = 8  # past the producers' timeout: request_timeout_ms 1000, so 6 s on the socket


def start_mirror(offline: str, live: dict[str, str], topic: str, log: Path) -> subprocess.Popen:
    """`logbus mirror` from the live clusters into the offline one, as an operator runs it."""
    args = [str(Path(sys.executable).parent / "logbus"), "--zookeeper", offline, "--log-level", "INFO", "mirror",
            "--name", MIRROR, "--topics", f"{topic},{MONITORING_TOPIC}", "--report-interval", "0"]
    for name, connect in live.items():
        args += ["--source", f"{name}={connect}"]
    env = {k: v for k, v in os.environ.items() if k != "LOGBUS_ZOOKEEPER"}
    return subprocess.Popen(args, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def wait_mirrored(live: dict[str, str], topics: list[str], timeout: float = 120) -> None:
    """Until the mirror's committed offsets on every live cluster leave no lag
    (`broker.client.offsets.records_lag`: a partition it never committed counts from its
    start)."""
    from broker.client.cluster import ConnectionPool
    from broker.client.metadata import open_metadata
    from broker.client.offsets import group_offsets, partition_offsets, records_lag

    handles = [(metadata, ConnectionPool(metadata, "demo", 10)) for metadata in map(open_metadata, live.values())]

    def lagging() -> bool:
        for metadata, pool in handles:
            for topic in topics:
                ends = partition_offsets(pool, topic)
                committed = group_offsets(metadata.zk, f"mirror-{MIRROR}", topic, sorted(ends))
                if any(records_lag(pool, topic, ends, committed).values()):
                    return True
        return False

    def behind() -> list[str]:
        """What lags, to name it when the wait fails."""
        out = []
        for metadata, pool in handles:
            for topic in topics:
                ends = partition_offsets(pool, topic)
                committed = group_offsets(metadata.zk, f"mirror-{MIRROR}", topic, sorted(ends))
                for p, n in records_lag(pool, topic, ends, committed).items():
                    if n:
                        out.append(f"{topic}-{p}: {n} records from {committed.get(p)} to {ends[p].latest}")
        return out

    try:
        deadline = time.monotonic() + timeout
        while lagging():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the mirror did not catch up within {timeout:.0f} s: {behind()}")
            time.sleep(0.3)
    finally:
        for metadata, pool in handles:
            pool.close()
            metadata.close()


def airflow_env(home: Path, zookeeper: str, warehouse: Path, topic: str, table: str, target: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags" / "examples"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW_CONN_LOGBUS_DEFAULT": json.dumps({"conn_type": "logbus", "extra": {"zookeeper": zookeeper}}),
        "LOGBUS_TOPIC": topic, "LOGBUS_TABLE": table, "LOGBUS_WAREHOUSE": str(warehouse),
        "LOGBUS_SENSOR_GRACE_MINUTES": "0", "LOGBUS_AUDIT_GRACE_MINUTES": "0", "LOGBUS_RETRY_DELAY_SECONDS": "1",
        "LOGBUS_TARGET": target,  # the value schema: the examples' default, the simulator's events
        "PYSPARK_PYTHON": sys.executable,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    })
    return env


def airflow(env: dict[str, str], *args: str, log: Path) -> None:
    cmd = [str(Path(sys.executable).parent / "airflow"), *args]
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        code = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"`airflow {' '.join(args)}` failed with {code}; log {log}:\n{tail}")


def describe_topic(logbus, topic: str) -> str:
    """The topic's partitions and the brokers holding each one's replicas."""
    assignment = logbus.metadata.assignment(topic) or {}
    factors = sorted({len(replicas) for replicas in assignment.values()})
    brokers = sorted({b for replicas in assignment.values() for b in replicas})
    return (f"topic {topic}: {len(assignment)} partitions, replication factor "
            f"{'/'.join(map(str, factors))} on brokers {', '.join(map(str, brokers))}")


def describe_table(target, warehouse: Path) -> str:
    """Where the table lives and its batches: one snapshot (Iceberg) or directory each."""
    lines = []
    if target.layout == "iceberg":
        table = target.table_or_fail()
        lines.append(f"Iceberg table {target.identifier} at {table.location()} "
                     f"(catalog {target.catalog_properties['uri']})")
        lines.append(f"  committed offsets (table property): {table.properties.get('logbus.committed-offsets')}")
        complete_through = table.properties.get("logbus.complete-through")
        lines.append(f"  complete through: {utc_minute(int(complete_through)) if complete_through else 'no hour yet'}")
        for snapshot in table.snapshots():
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            if "logbus.batch-id" not in summary:
                continue
            ranges = json.loads(summary["logbus.ranges"])
            lines.append(f"  snapshot {snapshot.snapshot_id}: batch {summary['logbus.batch-id']}, "
                         f"{summary['logbus.row-count']} rows, {summary.get('logbus.rejected-count', '0')} rejected, "
                         "ranges " + ", ".join(f"p{r['partition']}[{r['start']},{r['end']})" for r in ranges))
        lines.append("  read it: pyiceberg `catalog.load_table(...).scan().to_arrow()`, or "
                     "airflow_provider_logbus.spark.iceberg.read_iceberg(spark, table)")
    else:
        lines.append(f"Parquet table: {warehouse / target.table}  (spark.read.parquet('{warehouse / target.table}'))")
        for record in target.batches():
            lines.append(f"  batch {record.batch_id}: {record.row_count} rows, ranges "
                         + ", ".join(f"p{r.partition}[{r.start},{r.end})" for r in record.ranges))
    audits = sorted((warehouse / "_audit").rglob("*.json"))
    lines.append(f"audit reports written by the DAG: {len(audits)} under {warehouse / '_audit'}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description="logbus end-to-end demo")
    parser.add_argument("--hours", type=int, default=3)
    parser.add_argument("--rate", type=int, default=2000, help="events per server per hour")
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--target", choices=["iceberg", "directory"], default="iceberg")
    parser.add_argument("--seed", type=int, help="reproducible events (the simulator's seed); by default fresh ones")
    parser.add_argument("--keep", help="work directory (default: a new temp dir, kept so the Parquet can be inspected)")
    args = parser.parse_args()

    work = Path(args.keep or tempfile.mkdtemp(prefix="logbus-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    warehouse, home, log = work / "warehouse", work / "airflow", work / "airflow.log"
    home.mkdir(exist_ok=True)
    topic = table = "web_activity"
    print(f"demo directory: {work}")
    zookeeper = ZooKeeperServer(work / "zookeeper")
    clusters: list[LocalCluster] = []
    mirror = None
    try:
        zookeeper.start()
        connect = with_chroot(zookeeper.connect_string, "/logbus-demo")
        live = {name: with_chroot(zookeeper.connect_string, f"/logbus-demo-{name}") for name in ("east", "west")}
        cluster = LocalCluster(connect, work, settings=BROKER_SETTINGS)
        clusters.append(cluster)
        cluster.start_broker(0)
        cluster.start_broker(1)
        for name, where in live.items():
            clusters.append(LocalCluster(where, work / name, settings=LIVE_SETTINGS))
            clusters[-1].start_broker(0)
        east = clusters[1].brokers[0]

        def stall_east() -> None:
            """The east broker stalls (a GC pause, a VM migration) while a web server sends."""
            east.pause()
            threading.Timer(PAUSE_SECONDS, east.resume).start()
            print(f"east broker paused for {PAUSE_SECONDS} s while a web server sends: its requests time out "
                  "and are retried, and the retries are not stored twice")
        print("ZooKeeper, a broker in each live datacenter (east, west) and 2 offline brokers are up "
              "(offline topics replicated on both)")
        mirror_log = work / "mirror.log"
        mirror = start_mirror(connect, live, topic, mirror_log)
        print(f"logbus mirror {MIRROR}: east, west -> offline ({topic}, {MONITORING_TOPIC}); log {mirror_log}")

        from airflow_provider_logbus.examples.simulate_web_servers import simulate

        now = int(time.time() * 1000)
        first = now - now % HOUR_MS - args.hours * HOUR_MS
        env = airflow_env(home, connect, warehouse, topic, table, args.target)
        print("airflow db migrate ...")
        airflow(env, "db", "migrate", log=log)
        per_dc = {"east": (args.servers + 1) // 2, "west": args.servers // 2}
        produced = 0
        for h in range(args.hours):
            start, end_ms = first + h * HOUR_MS, first + (h + 1) * HOUR_MS
            seed = None if args.seed is None else args.seed * 1000 + h  # fresh events unless --seed
            first_server = 0
            for dc, servers in per_dc.items():
                # the hour's events, then the first minute of the next hour (or "now" for the last
                # hour): once every partition holds later data, the sensor knows the hour is complete
                stall = stall_east if (h == 0 and dc == "east") else None
                simulate(live[dc], topic, servers, start, end_ms, args.rate, seed=seed, first_server=first_server,
                         request_timeout_ms=1000, midway=stall)
                tail = (end_ms, end_ms + 60_000) if h + 1 < args.hours else (now - 30_000, now)
                simulate(live[dc], topic, servers, tail[0], tail[1], 30, seed=None if seed is None else seed + 500,
                         first_server=first_server, request_timeout_ms=1000)
                first_server += servers
            if h == 0:
                mirror.send_signal(signal.SIGKILL)
                mirror.wait(30)
                mirror = start_mirror(connect, live, topic, mirror_log)
                print("the mirror was killed with SIGKILL and restarted: it resumes from its checkpoint")
            produced += args.servers * (args.rate + 30)
            wait_mirrored(live, [topic, MONITORING_TOPIC])
            end = datetime.fromtimestamp(end_ms / 1000, timezone.utc)
            print(f"{args.servers} servers ({per_dc['east']} east, {per_dc['west']} west) sent "
                  f"{args.servers * args.rate} events stamped {end - timedelta(hours=1):%H:%M}-{end:%H:%M} UTC "
                  f"(+{args.servers * 30} later ones), mirrored; airflow dags test logbus_hourly_load "
                  f"{end.isoformat()} ...")
            airflow(env, "dags", "test", "logbus_hourly_load", end.isoformat(), log=log)

        from airflow_provider_logbus.batch import audit_inputs, await_broker_counts
        from airflow_provider_logbus.cluster import LogbusCluster
        from airflow_provider_logbus.completeness import judge
        from airflow_provider_logbus.reporttext import format_report
        from airflow_provider_logbus.examples.config import ExampleConfig
        from airflow_provider_logbus.targets import open_target

        config = ExampleConfig.from_environment(env)  # the table the example DAGs wrote
        target = open_target(config.target, config.table, warehouse=config.warehouse)
        with LogbusCluster(connect) as logbus:
            inputs = await_broker_counts(logbus, audit_inputs(logbus, target), config.topic, 60)
            topic_line = describe_topic(logbus, config.topic)
        report = judge(inputs.report(config.table, config.topic, first, now + 60_000, config.audit_threshold),
                       now_ms=int(time.time() * 1000), grace_ms=0)
        print()
        print(format_report(report))
        print()
        print(topic_line)
        print(describe_table(target, warehouse))
        target.close()
        print(f"Airflow log: {log}")
        ok = (report["status"] == "ok" and report["missing"] == 0 and report["duplicated"] == 0
              and report["produced"] > 0 and report.get("mirrored") == report["produced"])
        print("\nRESULT:", "every produced message is in the table exactly once" if ok else "INCOMPLETE")
        return 0 if ok else 1
    finally:
        if mirror is not None:
            mirror.send_signal(signal.SIGTERM)
            try:
                mirror.wait(60)
            except subprocess.TimeoutExpired:
                mirror.kill()
        for cluster in clusters:
            cluster.stop()
        zookeeper.stop()
        print("stopped the mirror, brokers and ZooKeeper")


if __name__ == "__main__":
    sys.exit(main())
