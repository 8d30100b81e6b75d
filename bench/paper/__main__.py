"""The Kafka paper's experiments (NetDB 2011, §4) on logbus, RabbitMQ and ActiveMQ
(and Redis Streams), side by side, with Python clients on every side.

    .venv/bin/python -m bench.paper                      # what `make bench` runs
    .venv/bin/python -m bench.paper --messages 100000 --peer-messages 20000   # a quick look

- Producer test: one producer, 200-byte messages; logbus at batch 1 and 50 with
  acks=0 (the paper's Kafka) and acks=1, idempotence off (each batch one request, as
  the paper's producer), and as rows of their own the idempotent default at acks=1;
  the peers one message at a time. The caller hands logbus one message a call (a web
  server's producer) and, in rows marked "50 a call", a whole batch to one
  `send_many`, as the paper's tool did (Kafka 0.7's `ProducerPerformance` passes
  `--batch-size` messages to one synchronous `send`: one request).
- Consumer test: one consumer reads everything back, each pull about 1,000 messages
  / 200 KB (logbus fetch size 200 KB; RabbitMQ prefetch 1000; ActiveMQ prefetch 1000;
  Redis XREAD COUNT 1000); peers acknowledge automatically.
- librdkafka (confluent-kafka) through the broker's Kafka listener, rows of their own
  beside the native client's (`librdkafka_side.py`; `--no-librdkafka` leaves them out).
- Storage: (bytes on disk after − before) / messages − 200.
- logbus end-to-end latency (send → consumer) at a fixed rate, per flush interval.

Peers are installed from Debian's packages when missing and run only for the
duration of the run, in a scratch directory on free loopback ports; everything is
stopped on the way out, also on failure, Ctrl-C or SIGTERM. Results go to
`bench/results/` (CSV, Markdown), the figures to `bench/plots/` (`--results DIR`,
`--plots DIR` or `none`); `--peers none` runs the logbus side alone.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.paper import logbus_side
from bench.paper.report import Latency, Run, Storage, draw, markdown, write_csv
from bench.paper.sampling import Sampler

ROOT = Path(__file__).resolve().parents[2]
MESSAGE_BYTES = 200
# One fixed message of random bytes: nothing on the way (Redis's snapshot LZF, say)
# can shrink it, and every system stores the same bytes.
PAYLOAD = random.Random(2011).randbytes(MESSAGE_BYTES)
PEERS = ("rabbitmq", "activemq", "redis")
PEER_NAMES = {"rabbitmq": "RabbitMQ", "activemq": "ActiveMQ", "redis": "Redis Streams"}
# The bench extra of pyproject.toml, installed when missing.
BENCH_MODULES = {"pika": "pika", "stomp": "stomp.py", "matplotlib": "matplotlib", "redis": "redis",
                 "confluent_kafka": "confluent-kafka"}


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def ensure_python_packages() -> None:
    missing = []
    for module in BENCH_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        log(f"installing the bench extra (missing: {', '.join(missing)})")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{ROOT}[bench]"], check=True)
        importlib.invalidate_caches()


class Stop(Exception):
    """SIGTERM or SIGHUP: unwind through every `finally`, stopping the servers."""


_stopping: str | None = None


def _on_signal(signum, _frame) -> None:
    """Ctrl-C, SIGTERM, SIGHUP: remember it (a client's clean-up may raise its own error
    over ours) and unwind."""
    global _stopping
    _stopping = f"stopped by {signal.Signals(signum).name}"
    raise Stop(_stopping)


def sampler(label: str, messages: int, every: int) -> Sampler:
    return Sampler(label, messages, max(1_000, min(every, messages // 10 or 1)), MESSAGE_BYTES)


# ------------------------------------------------------------------------- logbus

def run_logbus(args, workdir: Path, runs: list[Run], storage: list[Storage], latencies: list[Latency]) -> None:
    payload = PAYLOAD
    every = int(args.sample_mb * 1e6 // MESSAGE_BYTES)
    with logbus_side.ZooKeeperServer(workdir / "zk") as zk:
        with logbus_side.LocalCluster(zk.connect_string + "/paper", workdir / "logbus") as cluster:
            broker = cluster.start_broker(0, logbus_side.THROUGHPUT_SETTINGS, kafka=args.librdkafka)
            setup = logbus_side.LogbusSetup(zk, cluster, broker)
            ends = {}
            settings = [(batch, acks, False, False) for acks in args.acks for batch in args.batches]
            settings += [(batch, 1, True, False) for batch in args.idempotent]  # the Producer's default, its own rows
            settings += [(batch, acks, False, True) for acks in args.acks for batch in args.calls]  # the paper's tool
            settings += [(batch, 1, True, True) for batch in args.calls]
            for batch, acks, idempotent, whole in settings:
                setting = (f"batch {batch}, acks={acks}" + (", idempotent" if idempotent else "")
                           + (f", {batch} a call" if whole else ""))
                topic = f"paper-b{batch}-a{acks}" + ("-i" if idempotent else "") + ("-c" if whole else "")
                logbus_side.create_topic(setup, topic)
                s = sampler(f"logbus produce {setting}", args.messages, every)
                ends[topic] = logbus_side.produce(setup, topic, args.messages, payload, s, acks=acks, batch=batch,
                                                  queue_size=args.queue_size, idempotent=idempotent,
                                                  whole_batches=whole)
                runs.append(Run("logbus", "produce", setting, s.done, s.seconds, s.series(), batch))
            # storage and the consumer test on the last topic written (same bytes in every topic)
            topic = f"paper-b{args.batches[-1]}-a{args.acks[0]}"
            for t, end in ends.items():
                logbus_side.wait_visible(setup, t, end)
            used, _ = logbus_side.storage_overhead(setup, topic, args.messages, MESSAGE_BYTES)
            storage.append(Storage("logbus", args.messages, used))
            log(f"  logbus storage: {used:,} bytes, {storage[-1].per_message:.1f} bytes/message beyond the payload")
            s = sampler("logbus consume (fetch 200 KB)", args.messages, every)
            got = logbus_side.consume(setup, topic, args.messages, s)
            if got != args.messages:
                raise RuntimeError(f"logbus consumer read {got:,} of {args.messages:,} messages")
            runs.append(Run("logbus", "consume", "fetch 200 KB", s.done, s.seconds, s.series()))
            if args.librdkafka:
                run_librdkafka(args, setup, runs, every)
        if args.latency_seconds > 0:
            for flush_ms in args.latency_flush_ms:
                settings = {"log.flush.interval.ms": flush_ms, "log.flush.interval.messages": 1_000_000}
                with logbus_side.LocalCluster(zk.connect_string + f"/latency-{flush_ms}",
                                              workdir / f"latency-{flush_ms}") as cluster:
                    broker = cluster.start_broker(0, settings)
                    setup = logbus_side.LogbusSetup(zk, cluster, broker)
                    topic = "paper-latency"
                    logbus_side.create_topic(setup, topic)
                    values = logbus_side.latency(setup, topic, args.latency_rate, args.latency_seconds)
                    latencies.append(Latency(flush_ms, args.latency_rate, values))
                    lat = latencies[-1]
                    log(f"  latency, flush every {flush_ms} ms: median {lat.q(0.5):.1f} ms, p99 {lat.q(0.99):.1f} ms "
                        f"({len(values):,} messages)")


def run_librdkafka(args, setup: logbus_side.LogbusSetup, runs: list[Run], every: int) -> None:
    """librdkafka's producer and consumer through the broker's Kafka listener (issue 36)."""
    from bench.paper import librdkafka_side as side  # noqa: PLC0415 - confluent-kafka, of the bench extra

    topic = "paper-librdkafka"
    logbus_side.create_topic(setup, topic)
    s = sampler(f"{side.SYSTEM} produce", args.messages, every)
    side.produce(setup.broker.kafka_bootstrap, topic, args.messages, PAYLOAD, s)
    runs.append(Run(side.SYSTEM, "produce", side.PRODUCE_SETTING, s.done, s.seconds, s.series(), batch=0))
    s = sampler(f"{side.SYSTEM} consume", args.messages, every)
    got = side.consume(setup.broker.kafka_bootstrap, topic, args.messages, s)
    if got != args.messages:  # also what shows a record the producer failed to deliver
        raise RuntimeError(f"librdkafka consumer read {got:,} of {args.messages:,} records")
    runs.append(Run(side.SYSTEM, "consume", side.CONSUME_SETTING, s.done, s.seconds, s.series()))


# -------------------------------------------------------------------------- peers

def run_peer(name: str, args, workdir: Path, runs: list[Run], storage: list[Storage]) -> None:
    module = importlib.import_module({"redis": "bench.peers.redis_streams"}.get(name, f"bench.peers.{name}"))
    server_class = {"rabbitmq": "RabbitMQServer", "activemq": "ActiveMQServer", "redis": "RedisServer"}[name]
    system = PEER_NAMES[name]
    messages = args.peer_messages
    every = int(args.sample_mb * 1e6 // MESSAGE_BYTES)
    if not args.skip_install:
        module.install()
    server = getattr(module, server_class)(workdir)
    log(f"starting {system} (log {server.log_path})")
    server.start()
    try:
        from bench.peers.base import disk_listing, settled_disk_bytes  # noqa: PLC0415

        before = settled_disk_bytes(server.data_dir(), timeout=10)
        s = sampler(f"{system} produce", messages, every)
        module.produce(server, messages, PAYLOAD, s)
        runs.append(Run(system, "produce", "one at a time" if name != "redis" else "XADD, pipelined 50",
                        s.done, s.seconds, s.series(), notes="; ".join(s.notes)))
        after = settled_disk_bytes(server.data_dir(), timeout=60)
        storage.append(Storage(system, messages, after - before))
        args.results.mkdir(parents=True, exist_ok=True)
        (args.results / f"storage-{name}.txt").write_text(
            f"{system}: {messages:,} messages; {before:,} bytes before, {after:,} after\n"
            + disk_listing(server.data_dir()) + "\n")
        log(f"  {system} storage: {after - before:,} bytes, {storage[-1].per_message:.1f} bytes/message beyond the payload")
        s = sampler(f"{system} consume", messages, every)
        got = module.consume(server, messages, s)
        if got != messages:
            raise RuntimeError(f"{system} consumer read {got:,} of {messages:,} messages")
        runs.append(Run(system, "consume", "prefetch 1000, auto-ack" if name != "redis" else "XREAD COUNT 1000",
                        s.done, s.seconds, s.series()))
    finally:
        log(f"stopping {system}")
        server.stop()
        server.remove_data()


# --------------------------------------------------------------------------- main

def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} vCPUs ({cpu}), {mem:.0f} GiB, Python {platform.python_version()}, "
            f"load average at start {os.getloadavg()[0]:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000, help="logbus messages per run (paper: 10 million)")
    parser.add_argument("--peer-messages", type=int, default=500_000,
                        help="messages per run for each peer (they are slower; same shape)")
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated: rabbitmq,activemq,redis (or none)")
    parser.add_argument("--batches", default="1,50", help="logbus producer batch sizes")
    parser.add_argument("--acks", default="0,1", help="logbus producer acks settings (idempotence off: the paper's)")
    parser.add_argument("--idempotent", default="1,50",
                        help="batch sizes of the extra rows with the idempotent producer, acks=1 (the default Producer)")
    parser.add_argument("--calls", default="50",
                        help="batch sizes of the extra rows that hand a whole batch to one send_many call, as the "
                             "paper's tool (Kafka 0.7's ProducerPerformance) did; acks as --acks, and idempotent")
    parser.add_argument("--queue-size", type=int, default=logbus_side.QUEUE_SIZE,
                        help="logbus async producer queue (Kafka 0.7's default queue.size is 10,000)")
    parser.add_argument("--sample-mb", type=float, default=10.0, help="one throughput sample per this many MB")
    parser.add_argument("--latency-rate", type=int, default=2_000, help="messages/s of the latency run")
    parser.add_argument("--latency-seconds", type=float, default=15.0, help="length of each latency run (0: skip)")
    parser.add_argument("--latency-flush-ms", default="200,20", help="log.flush.interval.ms values for latency runs")
    parser.add_argument("--librdkafka", action=argparse.BooleanOptionalAction, default=True,
                        help="rows of librdkafka (confluent-kafka) through the broker's Kafka listener (issue 36)")
    parser.add_argument("--skip-install", action="store_true", help="do not apt-get/pip install anything")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--plots", default=str(ROOT / "bench" / "plots"),
                        help="where the figures go (default bench/plots; none: no figures, no matplotlib needed)")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.acks = [int(a) for a in args.acks.split(",")]
    args.idempotent = [int(b) for b in args.idempotent.split(",") if b]
    args.calls = [int(b) for b in args.calls.split(",") if b]
    args.latency_flush_ms = [int(f) for f in args.latency_flush_ms.split(",") if f]
    peers = [p for p in args.peers.split(",") if p and p != "none"]
    for p in peers:
        if p not in PEERS:
            parser.error(f"unknown peer {p!r}; choose from {', '.join(PEERS)}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    if not args.skip_install:
        ensure_python_packages()
    started = time.time()
    about = machine()
    log(f"bench.paper: {about}")
    runs: list[Run] = []
    storage: list[Storage] = []
    latencies: list[Latency] = []
    failed = None
    try:
        with tempfile.TemporaryDirectory(prefix="logbus-paper-") as scratch:
            workdir = Path(scratch)
            log(f"logbus: {args.messages:,} messages of {MESSAGE_BYTES} bytes per run")
            run_logbus(args, workdir, runs, storage, latencies)
            for p in peers:
                log(f"{PEER_NAMES[p]}: {args.peer_messages:,} messages of {MESSAGE_BYTES} bytes")
                try:
                    run_peer(p, args, workdir, runs, storage)
                except (KeyboardInterrupt, Stop):
                    raise
                except Exception as exc:  # one peer failing must not lose the others' results
                    if _stopping:
                        raise Stop(_stopping) from exc
                    failed = f"{PEER_NAMES[p]} failed: {type(exc).__name__}: {exc}"
                    log(failed)
    except (KeyboardInterrupt, Stop) as exc:
        log(f"\ninterrupted ({_stopping or exc or 'Ctrl-C'}); every server was stopped, no results written")
        return 130
    except Exception as exc:
        if _stopping:
            log(f"\ninterrupted ({_stopping}: {exc}); every server was stopped, no results written")
            return 130
        raise
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
    order = {"logbus": 0, "RabbitMQ": 1, "ActiveMQ": 2, "Redis Streams": 3}
    storage.sort(key=lambda s: order.get(s.system, 9))
    write_csv(args.results, runs, storage, latencies)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"{when}; {about}; load average at end {os.getloadavg()[0]:.2f}; "
            f"took {time.time() - started:.0f} s\n\n"
            f"logbus {args.messages:,} messages per run, peers {args.peer_messages:,}\n\n"
            + markdown(runs, storage, latencies))
    (args.results / "results.md").write_text(text)
    if args.plots != "none":
        draw(runs, Path(args.plots))
    print(text)
    log(f"results in {args.results}, plots in {args.plots}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
