"""`make demo`: from nothing to an audited Parquet table.

Starts ZooKeeper and two brokers (broker.localcluster), simulates three web servers
producing a few hours of JSON activity (timestamps over the past hours, monitoring
events on), runs the example hourly DAG for each of those hours with `airflow dags test`
(temporary AIRFLOW_HOME, SQLite, `airflow db migrate`), runs the daily audit DAG's
operator over the same hours, prints produced / loaded / completeness per hour and
where the Parquet lives, and stops everything, also on failure.

    .venv/bin/python demo/run_demo.py [--hours 3] [--rate 2000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.localcluster import LocalCluster, ZooKeeperServer, wait_until  # noqa: E402

HOUR_MS = 3_600_000


def airflow_env(home: Path, zookeeper: str, warehouse: Path, topic: str, table: str) -> dict[str, str]:
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


def main() -> int:
    parser = argparse.ArgumentParser(description="logbus end-to-end demo")
    parser.add_argument("--hours", type=int, default=3)
    parser.add_argument("--rate", type=int, default=2000, help="events per server per hour")
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--keep", help="work directory (default: a new temp dir, kept so the Parquet can be inspected)")
    args = parser.parse_args()

    work = Path(args.keep or tempfile.mkdtemp(prefix="logbus-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    warehouse, home, log = work / "warehouse", work / "airflow", work / "airflow.log"
    home.mkdir(exist_ok=True)
    topic = table = "web_activity"
    print(f"demo directory: {work}")
    zookeeper = ZooKeeperServer(work / "zookeeper")
    cluster = None
    try:
        zookeeper.start()
        connect = zookeeper.connect_string + "/logbus-demo"
        cluster = LocalCluster(connect, work, settings={"log.flush.interval.ms": 50, "num.partitions": 4})
        cluster.start_broker(0)
        cluster.start_broker(1)
        print("ZooKeeper and 2 brokers are up")

        from dags.examples.simulate_web_servers import simulate

        now = int(time.time() * 1000)
        first = now - now % HOUR_MS - args.hours * HOUR_MS
        last_end = now - now % HOUR_MS
        env = airflow_env(home, connect, warehouse, topic, table)
        print("airflow db migrate ...")
        airflow(env, "db", "migrate", log=log)
        produced = 0
        for h in range(args.hours):
            start, end_ms = first + h * HOUR_MS, first + (h + 1) * HOUR_MS
            # the hour's events, then the first minute of the next hour (or "now" for the last
            # hour): once every partition holds later data, the sensor knows the hour is complete
            simulate(connect, topic, args.servers, start, end_ms, args.rate, seed=h)
            tail = (end_ms, end_ms + 60_000) if h + 1 < args.hours else (now - 30_000, now)
            simulate(connect, topic, args.servers, tail[0], tail[1], 30, seed=100 + h)
            produced += args.servers * (args.rate + 30)
            end = datetime.fromtimestamp(end_ms / 1000, timezone.utc)
            print(f"{args.servers} servers sent {args.servers * args.rate} events stamped "
                  f"{end - timedelta(hours=1):%H:%M}-{end:%H:%M} UTC (+{args.servers * 30} later ones); "
                  f"airflow dags test logbus_hourly_load {end.isoformat()} ...")
            airflow(env, "dags", "test", "logbus_hourly_load", end.isoformat(), log=log)

        os.environ.update({k: v for k, v in env.items() if k.startswith(("AIRFLOW", "LOGBUS"))})
        from airflow_provider_logbus.completeness import format_report
        from airflow_provider_logbus.hooks.logbus import LogbusHook

        hook = LogbusHook(zookeeper=connect)
        report = hook.audit(warehouse=str(warehouse), table=table, topic=topic, start_ms=first, end_ms=now + 60_000,
                            threshold=0.999)
        hook.close()
        print()
        print(format_report(report))
        audits = sorted((warehouse / "_audit" / table).glob("*.json"))
        print(f"\nParquet table: {warehouse / table}  (spark.read.parquet('{warehouse / table}'))")
        for batch in sorted((warehouse / table).glob("batch_id=*")):
            record = json.loads((batch / "_logbus_batch.json").read_text())
            print(f"  {batch.name}: {record['row_count']} rows, ranges "
                  + ", ".join(f"p{r['partition']}[{r['start']},{r['end']})" for r in record["ranges"]))
        print(f"audit reports written by the DAG: {len(audits)} in {warehouse / '_audit' / table}")
        print(f"Airflow log: {log}")
        ok = report["missing"] == 0 and report["duplicated"] == 0 and report["produced"] > 0
        print("\nRESULT:", "every produced message is in the table exactly once" if ok else "INCOMPLETE")
        return 0 if ok else 1
    finally:
        if cluster is not None:
            cluster.stop()
        zookeeper.stop()
        print("stopped brokers and ZooKeeper")


if __name__ == "__main__":
    sys.exit(main())
