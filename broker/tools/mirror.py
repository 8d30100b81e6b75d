"""`logbus mirror`: run the mirror (`broker.client.mirror`) from the command line until
SIGTERM or Ctrl-C, reporting per-partition lag and stalls (docs/operations.md,
"Mirroring"). What can never work (`MirrorRefused`) ends it with one line on stderr
and exit status 1, as every `logbus` failure does."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from broker.client.mirror import PARTITIONINGS, Mirror, MirrorSource


def parse_source(text: str) -> MirrorSource:
    """`NAME=ZOOKEEPER` (host:port[/chroot]) or `NAME=brokers:HOST:PORT,HOST:PORT`."""
    name, sep, where = text.partition("=")
    if not sep or not name or not where:
        raise argparse.ArgumentTypeError(f"--source {text!r}: write NAME=ZOOKEEPER or NAME=brokers:HOST:PORT[,HOST:PORT]")
    if where.startswith("brokers:"):
        return MirrorSource(name, brokers=where[len("brokers:"):])
    return MirrorSource(name, zookeeper=where)


def add_parser(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("mirror", parents=[common], help="mirror topics from source clusters into this one",
                       description="Pull topics from one or more source clusters into the cluster of --zookeeper, "
                                   "exactly once, until SIGTERM.")
    p.add_argument("--name", required=True, help="the mirror's name: its checkpoints and source group mirror-NAME")
    p.add_argument("--source", action="append", required=True, metavar="NAME=ZOOKEEPER", type=parse_source,
                   help="a source cluster (repeatable): NAME=host:port[/chroot] or NAME=brokers:host:port,...")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--topics", help="comma-separated topic names")
    which.add_argument("--pattern", help="a regular expression topic names must match in full")
    p.add_argument("--partitioning", choices=PARTITIONINGS, default="same",
                   help="same: the source partition's number (default); key: the key's partition in the target")
    p.add_argument("--start", choices=("earliest", "latest"), default="earliest",
                   help="where a partition without a checkpoint starts (default earliest)")
    p.add_argument("--report-interval", type=float, default=10.0, metavar="SECONDS",
                   help="print per-partition lag this often (default 10; 0: never)")
    p.add_argument("--no-monitoring", action="store_true",
                   help="publish no monitoring events (tier mirror) into the target's _logbus_monitoring")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, cluster) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    topics = [t.strip() for t in args.topics.split(",") if t.strip()] if args.topics else None
    # the sources are reached as the command config says, the target too (one principal)
    sources = [MirrorSource(s.name, s.zookeeper, s.brokers, cluster.security) for s in args.source]
    mirror = Mirror(args.name, sources, cluster.connect, topics=topics, pattern=args.pattern,
                    target_security=cluster.security,
                    partitioning=args.partitioning, start=args.start, monitoring=not args.no_monitoring)
    reporter = threading.Thread(target=_report, args=(mirror, stop, args.report_interval), daemon=True)
    try:
        if args.report_interval > 0:
            reporter.start()
        mirror.run(stop)
    finally:
        mirror.close()
    print(f"mirror {args.name} stopped", file=sys.stderr)
    return 0


def _report(mirror: Mirror, stop: threading.Event, interval: float) -> None:
    """`lag <source> <topic> <partition> <records>` per partition, and while a partition
    is stalled `<seconds>s stalled: <why>` after it."""
    while not stop.wait(interval):
        for (source, topic, partition), status in sorted(mirror.status().items()):
            stalled = f"\t{status.stalled:.0f}s stalled: {status.trouble}" if status.trouble else ""
            print(f"lag\t{source}\t{topic}\t{partition}\t{status.lag}{stalled}", flush=True)
