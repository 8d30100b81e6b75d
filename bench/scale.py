"""What one broker costs as partitions and connections grow (not a test).

Partitions — for each count (10, 1,000 and 10,000 by default), a fresh one-broker
cluster, one topic of that many partitions: the time until every partition's log
exists, the broker's RSS and its idle CPU over `--idle-seconds`, produce throughput
with the messages spread over every partition (acks=1, batch 50), then the start-up
time after a clean stop (start to registered in ZooKeeper) and the log recovery time
after a SIGKILL (start to its logs loaded; registering then waits for the killed
session's node to expire, a session timeout, which is not the logs' cost).

Connections — one broker, a topic of 10 partitions, and 10, 100 and 1,000 client
connections, each sending one PRODUCE of 10 messages (acks=1) per round, all
connections' requests written before any answer is read: the throughput, the worst
round trip of a request, and the broker's RSS.

    .venv/bin/python -m bench.scale --partitions 10,1000,10000 --connections 10,100,1000
"""

from __future__ import annotations

import argparse
import logging
import selectors
import socket
import time
from pathlib import Path

from bench.replica_idle import cpu_seconds
from broker.client.producer import Producer
from broker.common.message import encode_message_set
from broker.common.protocol import ApiKey, ProduceRequest, encode_request
from broker.common.zklayout import create_topic
from harness.cluster import scratch_cluster
from harness.frames import read_frame
from harness.process import wait_until
from harness.zookeeper import client

SETTINGS = {"log.flush.interval.ms": 200, "log.flush.interval.messages": 100_000, "log.segment.bytes": 1 << 20}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def logs_loaded_at(log_path: Path) -> float:
    """When the broker's last start finished loading its logs (its "loaded N partitions"
    line), as a Unix time."""
    import datetime

    lines = [line for line in log_path.read_text().splitlines() if "loaded " in line and " partitions from " in line]
    stamp = datetime.datetime.strptime(lines[-1][:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def partitions_run(count: int, messages: int, idle_seconds: float) -> dict:
    with scratch_cluster("logbus-bench-scale-", SETTINGS) as (zookeeper, cluster):
        broker = cluster.start_broker(0, {"num.partitions": 1})
        start = time.perf_counter()
        with client(zookeeper.connect_string) as zk:
            create_topic(zk, "wide", count)
        wait_until(lambda: sum(1 for _ in broker.log_dir.glob("wide-*")) == count, 1800, f"{count} partition logs")
        created = time.perf_counter() - start
        time.sleep(1)
        pid = broker.process.pid
        before = cpu_seconds(pid)
        time.sleep(idle_seconds)
        idle_cpu = (cpu_seconds(pid) - before) / idle_seconds * 100
        rss = rss_mib(pid)
        value = b"x" * 200
        with Producer(zookeeper=zookeeper.connect_string, mode="async", acks=1, batch_size=50, linger_ms=5,
                      monitoring=False, enable_idempotence=False, queue_size=100_000) as producer:
            t0 = time.perf_counter()
            for i in range(messages):
                producer.send("wide", value, partition=i % count)
            report = producer.flush(1800)
            rate = messages / (time.perf_counter() - t0)
        assert report.ok, report
        broker.stop()
        t0 = time.perf_counter()
        broker.start(timeout=1800)
        restart = time.perf_counter() - t0
        broker.kill()
        t0 = time.time()
        broker.start(timeout=1800)
        recovery = logs_loaded_at(broker.log_path) - t0  # not the wait for the killed session's node to expire
        return {"partitions": count, "created_s": created, "rss_mib": rss, "idle_cpu_pct": idle_cpu,
                "produce_msg_s": rate, "restart_s": restart, "recovery_s": recovery}


def connections_run(count: int, rounds: int) -> dict:
    with scratch_cluster("logbus-bench-scale-", SETTINGS) as (zookeeper, cluster):
        broker = cluster.start_broker(0)
        with client(zookeeper.connect_string) as zk:
            create_topic(zk, "busy", 10)
        wait_until(lambda: sum(1 for _ in broker.log_dir.glob("busy-*")) == 10, 60, "10 partition logs")
        messages = encode_message_set([(None, b"x" * 200, 1)] * 10)
        socks = []
        for _ in range(count):
            sock = socket.create_connection(broker.address, timeout=60)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks.append(sock)
        selector = selectors.DefaultSelector()
        worst, sent, correlation = 0.0, 0, 0
        t0 = time.perf_counter()
        for round_ in range(rounds):
            started = {}
            for i, sock in enumerate(socks):
                correlation += 1
                body = ProduceRequest(1, 30_000, "busy", i % 10, messages).encode()
                sock.sendall(encode_request(ApiKey.PRODUCE, correlation, "scale", body))
                started[sock] = time.perf_counter()
            for sock in socks:
                selector.register(sock, selectors.EVENT_READ)
            waiting = set(socks)
            while waiting:
                for key, _ in selector.select(60):
                    sock = key.fileobj
                    read_frame(sock)
                    worst = max(worst, time.perf_counter() - started[sock])
                    selector.unregister(sock)
                    waiting.discard(sock)
            sent += 10 * count
        rate = sent / (time.perf_counter() - t0)
        rss = rss_mib(broker.process.pid)
        for sock in socks:
            sock.close()
        return {"connections": count, "msg_s": rate, "worst_ms": worst * 1000, "rss_mib": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="10,1000,10000")
    parser.add_argument("--connections", default="10,100,1000")
    parser.add_argument("--messages", type=int, default=200_000, help="messages spread over the partitions")
    parser.add_argument("--rounds", type=int, default=50, help="rounds of one request per connection")
    parser.add_argument("--idle-seconds", type=float, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(f"{'partitions':>10} {'create s':>9} {'RSS MiB':>8} {'idle CPU %':>10} {'produce msg/s':>14} "
          f"{'restart s':>9} {'recovery s':>10}", flush=True)
    for count in (int(c) for c in args.partitions.split(",") if c):
        r = partitions_run(count, args.messages, args.idle_seconds)
        print(f"{r['partitions']:>10} {r['created_s']:9.1f} {r['rss_mib']:8.0f} {r['idle_cpu_pct']:10.1f} "
              f"{r['produce_msg_s']:14,.0f} {r['restart_s']:9.1f} {r['recovery_s']:10.1f}", flush=True)
    print(f"{'connections':>11} {'msg/s':>10} {'worst ms':>9} {'RSS MiB':>8}", flush=True)
    for count in (int(c) for c in args.connections.split(",") if c):
        r = connections_run(count, args.rounds)
        print(f"{r['connections']:>11} {r['msg_s']:10,.0f} {r['worst_ms']:9.1f} {r['rss_mib']:8.0f}", flush=True)


if __name__ == "__main__":
    main()
