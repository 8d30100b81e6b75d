"""The `logbus` command's subcommands: produce, consume, offsets, groups, perf, topics
(`broker.tools.topics`), mirror (`broker.tools.mirror`), zookeeper (`broker.tools.zookeeper`).

Every command finds the cluster through `--zookeeper` or `LOGBUS_ZOOKEEPER`. A failure
of the broker or ZooKeeper is one line on stderr and exit status 1 (2 for usage
errors) — never a traceback: operators script these commands.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from kazoo.exceptions import KazooException, NoNodeError

from broker.client.cluster import LEADER_MOVED, ConnectionPool
from broker.client.metadata import ZooKeeperMetadata, connect_zookeeper
from broker.client.errors import ConsumerTimeout
from broker.client.offsets import PartitionOffsets, offsets_before, records_lag
from broker.common.errors import LogbusError, UnknownTopic
from broker.common.protocol import EARLIEST, LATEST, check_topic_name
from broker.common.zklayout import (
    CONSUMERS, group_ids_path, group_path, offsets_path, owner_path, owners_path, read_offset,
)
from broker.tools import mirror as mirror_command, registry as registry_command, zookeeper as zookeeper_command
from broker.tools import security as security_commands, topics as topics_command
from broker.tools.output import CommandError, show
from broker.tools.security import read_command_config

logger = logging.getLogger(__name__)


def zookeeper_of(args: argparse.Namespace) -> str:
    connect = args.zookeeper or os.environ.get("LOGBUS_ZOOKEEPER")
    if not connect:
        raise CommandError("no ZooKeeper given: use --zookeeper HOST:PORT[/CHROOT] or set LOGBUS_ZOOKEEPER")
    return connect


class Cluster:
    """What a command needs: a ZooKeeper client, watched metadata, connections."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.connect = zookeeper_of(args)
        self.security, self.zookeeper_auth = read_command_config(args.command_config)
        self.zk = connect_zookeeper(self.connect, args.zookeeper_timeout, auth=self.zookeeper_auth)
        self.metadata = ZooKeeperMetadata(self.zk, security=self.security)
        self.pool = ConnectionPool(self.metadata, "logbus-cli", 30.0)

    def leaders(self, topic: str) -> dict[int, int]:
        check_topic_name(topic)
        leaders = self.metadata.partitions(topic)
        if leaders is None:
            raise UnknownTopic(f"unknown topic {topic!r}")
        return leaders

    def offset(self, topic: str, partition: int, time_ms: int) -> int | None:
        """One offset from the partition's leader; None while it is down or moving."""
        try:
            offsets = offsets_before(self.pool, topic, partition, time_ms, 1)
        except (ConnectionError, *LEADER_MOVED):
            return None
        return offsets[0] if offsets else None

    def close(self) -> None:
        self.pool.close()
        self.metadata.close()
        self.zk.stop()
        self.zk.close()


# -------------------------------------------------------------------------- produce


def cmd_produce(args: argparse.Namespace, cluster: Cluster) -> int:
    from broker.client.producer import Producer

    check_topic_name(args.topic)
    separator = args.key_separator.encode() if args.key_separator else None
    producer = Producer(metadata=cluster.metadata, acks=args.acks, compression=args.compression, mode="async",
                        batch_size=args.batch_size, linger_ms=args.linger_ms, monitoring=not args.no_monitoring,
                        enable_idempotence=args.acks != 0 and not args.no_idempotence)
    sent = 0
    try:
        for line in sys.stdin.buffer:
            line = line.rstrip(b"\r\n")
            key = None
            if separator is not None and separator in line:
                key, line = line.split(separator, 1)
            producer.send(args.topic, line, key=key, partition=args.partition)
            sent += 1
    finally:
        report = producer.close(args.timeout)
    if report.failed:
        first = report.failed[0].error
        print(f"logbus: {len(report.failed)} of {sent} messages not sent: {type(first).__name__}: {first}",
              file=sys.stderr)
        return 1
    logger.info("sent %d messages", sent)
    return 0


# -------------------------------------------------------------------------- consume


def cmd_consume(args: argparse.Namespace, cluster: Cluster) -> int:
    cluster.leaders(args.topic)
    if args.offset is not None and args.partition is None:
        raise CommandError("--offset needs --partition (offsets are per partition)")
    out = sys.stdout.buffer
    count = 0
    for value in (_consume_group(args, cluster) if args.group else _consume_partitions(args, cluster)):
        out.write(value + b"\n")
        count += 1
        if args.count is not None and count >= args.count:
            break
    out.flush()
    return 0


def _consume_group(args: argparse.Namespace, cluster: Cluster):
    from broker.client.group import ConsumerGroup

    timeout = None if args.idle_timeout is None else int(args.idle_timeout * 1000)
    group = ConsumerGroup(args.group, {args.topic: 1}, cluster.connect, security=cluster.security,
                          auto_offset_reset="smallest" if args.from_beginning else "largest",
                          consumer_timeout_ms=timeout, auto_commit_interval_ms=1000)
    try:
        for message in group.streams[args.topic][0]:
            yield message.value
    except ConsumerTimeout:
        return
    finally:
        group.close()


def _consume_partitions(args: argparse.Namespace, cluster: Cluster):
    """Round-robin over the topic's partitions (or one), short long-polls each."""
    from broker.client.consumer import SimpleConsumer

    partitions = [args.partition] if args.partition is not None else sorted(cluster.leaders(args.topic))
    start = args.offset if args.offset is not None else ("smallest" if args.from_beginning else "largest")
    consumers = [SimpleConsumer(args.topic, p, metadata=cluster.metadata, offset=start,
                                max_wait_ms=50 if len(partitions) > 1 else 500) for p in partitions]
    last = time.monotonic()
    try:
        while True:
            for consumer in consumers:
                for message in consumer.fetch():
                    last = time.monotonic()
                    yield message.value
            if args.idle_timeout is not None and time.monotonic() - last >= args.idle_timeout:
                return
    finally:
        for consumer in consumers:
            consumer.close()


# -------------------------------------------------------------------------- offsets


def cmd_offsets(args: argparse.Namespace, cluster: Cluster) -> int:
    when = {"earliest": EARLIEST, "latest": LATEST}.get(args.time)
    if when is None:
        try:
            when = int(args.time)
        except ValueError:
            raise CommandError(f"--time must be earliest, latest or milliseconds, not {args.time!r}") from None
    for partition, leader in sorted(cluster.leaders(args.topic).items()):
        if leader < 0:
            print(f"{partition}\tunavailable")
            continue
        offsets = offsets_before(cluster.pool, args.topic, partition, when, args.max_offsets)
        print(f"{partition}\t" + " ".join(str(o) for o in offsets))
    return 0


# --------------------------------------------------------------------------- groups


def cmd_groups(args: argparse.Namespace, cluster: Cluster) -> int:
    zk = cluster.zk
    if args.action == "list":
        try:
            groups = sorted(zk.get_children(CONSUMERS))
        except NoNodeError:
            groups = []
        for group in groups:
            print(group)
        return 0
    if not args.group:
        raise CommandError("groups describe needs a GROUP")
    if not zk.exists(group_path(args.group)):
        raise CommandError(f"unknown group {args.group!r}")
    topics = set()
    for path in (offsets_path(args.group), owners_path(args.group)):
        try:
            topics |= set(zk.get_children(path))
        except NoNodeError:
            pass
    try:
        members = len(zk.get_children(group_ids_path(args.group)))
    except NoNodeError:
        members = 0
    print(f"group {args.group}: {members} consumers")
    print("topic\tpartition\tcommitted\tlatest\tlag_records\towner")
    for topic in sorted(topics):
        try:
            leaders = cluster.leaders(topic)
        except UnknownTopic:
            continue
        for partition, leader in sorted(leaders.items()):
            committed = read_offset(zk, args.group, topic, partition)
            latest = cluster.offset(topic, partition, LATEST) if leader >= 0 else None
            lag_records = _group_lag(cluster, topic, partition, leader, committed, latest)
            try:
                owner = zk.get(owner_path(args.group, topic, partition))[0].decode()
            except NoNodeError:
                owner = None
            print(f"{topic}\t{partition}\t{show(committed)}\t{show(latest)}\t{show(lag_records)}\t{show(owner)}")
    return 0


def _group_lag(cluster: Cluster, topic: str, partition: int, leader: int, committed: int | None,
               latest: int | None) -> int | None:
    """The group's lag in records, as `offsets.records_lag` computes it for everyone;
    None without a committed offset or while the leader does not answer."""
    if committed is None or latest is None:
        return None
    if (earliest := cluster.offset(topic, partition, EARLIEST)) is None:
        return None
    offsets = PartitionOffsets(topic, partition, leader, earliest, latest)
    try:
        return records_lag(cluster.pool, topic, {partition: offsets}, {partition: committed})[partition]
    except (ConnectionError, *LEADER_MOVED):
        return None


# ---------------------------------------------------------------------------- parser


def _common(defaults: bool) -> argparse.ArgumentParser:
    """The options every command takes. Subcommands get them without defaults
    (SUPPRESS), so an option given before the subcommand is not reset by it."""

    def default(value):
        return value if defaults else argparse.SUPPRESS

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--zookeeper", default=default(None),
                        help="ZooKeeper connect string host:port[/chroot] (default: $LOGBUS_ZOOKEEPER)")
    common.add_argument("--zookeeper-timeout", type=float, default=default(10.0), metavar="SECONDS",
                        help="give up connecting to ZooKeeper after this long (default 10)")
    common.add_argument("--command-config", default=default(None), metavar="FILE",
                        help="client security properties (security.protocol, ssl.*, sasl.*) and zookeeper.auth")
    common.add_argument("--log-level", default=default("WARNING"), help="client logging on stderr (default WARNING)")
    return common


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="logbus", description="Operate a logbus cluster.", parents=[_common(True)])
    common = _common(False)
    sub = parser.add_subparsers(dest="command", required=True)

    for command in (mirror_command, zookeeper_command, registry_command):
        command.add_parser(sub, common)
    security_commands.add_parsers(sub, common)
    topics_command.add_parser(sub, common)

    p = sub.add_parser("produce", parents=[common], help="send stdin lines as messages")
    p.add_argument("topic")
    p.add_argument("--key-separator", metavar="S", help="split each line at the first S into key and value")
    p.add_argument("--acks", type=int, choices=[0, 1, -1], default=1)
    p.add_argument("--compression", choices=["none", "gzip", "snappy", "lz4", "zstd"], default="none")
    p.add_argument("--partition", type=int)
    p.add_argument("--batch-size", type=int, default=200)
    p.add_argument("--linger-ms", type=int, default=5)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to deliver what is left at the end")
    p.add_argument("--no-monitoring", action="store_true", help="do not publish monitoring events")
    p.add_argument("--no-idempotence", action="store_true",
                   help="plain message sets, one entry per message (retries may duplicate); implied by --acks 0")
    p.set_defaults(run=cmd_produce)

    p = sub.add_parser("consume", parents=[common], help="print message values, one per line")
    p.add_argument("topic")
    p.add_argument("--partition", type=int)
    p.add_argument("--offset", type=int, help="start at the record with this offset (with --partition)")
    p.add_argument("--from-beginning", action="store_true", help="start at the earliest offset (default: latest)")
    p.add_argument("--group", help="consume as a member of this consumer group (commits offsets)")
    p.add_argument("--count", type=int, help="stop after N messages")
    p.add_argument("--idle-timeout", type=float, metavar="SECONDS", help="stop after this long without a message")
    p.set_defaults(run=cmd_consume)

    p = sub.add_parser("offsets", parents=[common], help="offsets of every partition at a time")
    p.add_argument("topic")
    p.add_argument("--time", default="latest", help="earliest, latest, or milliseconds since the epoch")
    p.add_argument("--max-offsets", type=int, default=1)
    p.set_defaults(run=cmd_offsets)

    p = sub.add_parser("groups", parents=[common], help="list consumer groups or describe one")
    p.add_argument("action", choices=["list", "describe"])
    p.add_argument("group", nargs="?")
    p.set_defaults(run=cmd_groups)

    from broker.tools.perf import add_perf_parser

    add_perf_parser(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s [%(name)s] %(message)s",
                        stream=sys.stderr)
    logging.getLogger("kazoo").setLevel(max(logging.ERROR, logging.getLogger().level))
    cluster = None
    try:
        cluster = None if getattr(args, "own_connection", False) else Cluster(args)
        return args.run(args, cluster)
    except (CommandError, LogbusError, ValueError) as exc:
        print(f"logbus: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except (ConnectionError, OSError) as exc:
        print(f"logbus: connection failed: {exc}", file=sys.stderr)
        return 1
    except KazooException as exc:
        print(f"logbus: ZooKeeper error: {type(exc).__name__} {exc}".rstrip(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if cluster is not None:
            try:
                cluster.close()
            except Exception:
                pass
