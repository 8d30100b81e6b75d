"""`logbus topics`: list, create, describe and delete topics (docs/clients.md, "The
`logbus` command"). Creation writes the assignment in ZooKeeper as a broker does;
deletion asks a broker (DELETE_TOPIC), whose ACLs decide, and waits until it is
complete."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from broker.common.partitionstates import legacy_state, live_leader
from broker.common.protocol import EARLIEST, LATEST, check_topic_name
from broker.common.zklayout import create_topic, read_partition_state
from broker.tools.output import CommandError, show

if TYPE_CHECKING:
    from broker.tools.admin import Cluster


def add_parser(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("topics", parents=[common], help="list, create, describe or delete topics",
                       usage="logbus topics {list,create,describe,delete} [NAME] | --list | --create NAME | "
                             "--describe [NAME] | --delete NAME")
    p.add_argument("words", nargs="*", metavar="ACTION [NAME]", help="list, create NAME, describe [NAME], delete NAME")
    modes = p.add_mutually_exclusive_group()
    for mode in TOPIC_ACTIONS:
        modes.add_argument(f"--{mode}", dest="mode", action="store_const", const=mode, help=f"the same as `{mode}`")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--replication-factor", type=int, default=1, metavar="N",
                   help="replicas of each partition, on distinct live brokers (default 1)")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="delete: how long to wait for the deletion to complete (default 30)")
    p.set_defaults(run=cmd_topics)


TOPIC_ACTIONS = ("list", "create", "describe", "delete")


def topic_action(args: argparse.Namespace) -> None:
    """`topics create NAME` and `topics --create NAME` alike: set args.action, args.name."""
    words = list(args.words)
    if args.mode is None:
        if not words or words[0] not in TOPIC_ACTIONS:
            raise CommandError(f"topics needs an action: {', '.join(TOPIC_ACTIONS)} (or --create, --describe, --delete, --list)")
        args.mode = words.pop(0)
    if len(words) > 1:
        raise CommandError(f"topics {args.mode} takes at most one NAME, got {' '.join(words)}")
    args.action, args.name = args.mode, (words[0] if words else None)


def cmd_topics(args: argparse.Namespace, cluster: "Cluster") -> int:
    topic_action(args)
    if args.action == "list":
        for topic in cluster.metadata.topics():
            print(topic)
    elif args.action == "create":
        if not args.name:
            raise CommandError("topics create needs a NAME")
        check_topic_name(args.name)
        if args.partitions < 1:
            raise CommandError("--partitions must be at least 1")
        assignment = create_topic(cluster.zk, args.name, args.partitions, args.replication_factor)
        print(f"created topic {args.name} with {len(assignment)} partitions, replication factor "
              f"{args.replication_factor}")
    elif args.action == "delete":
        delete(cluster, args.name, args.timeout)
    else:
        describe(cluster, [args.name] if args.name else cluster.metadata.topics())
    return 0


def delete(cluster: "Cluster", name: str | None, timeout: float) -> None:
    """DELETE_TOPIC through a live broker, so the brokers' ACLs decide (Delete on the
    topic): returns once the deletion is complete, its data gone and the name free."""
    if not name:
        raise CommandError("topics delete needs a NAME")
    check_topic_name(name)
    if timeout <= 0:
        raise CommandError(f"--timeout must be more than 0 seconds, not {timeout:g}")
    cluster.pool.any().delete_topic(name, int(timeout * 1000))
    print(f"deleted topic {name}")


def describe(cluster: "Cluster", topics: list[str]) -> None:
    """One row per partition: its live leader (OFFLINE when none: the partition takes no
    produce and serves no fetch until the controller elects one), the leader epoch,
    the replicas (preferred leader first), the ISR, and the leader's offsets."""
    brokers = cluster.metadata.brokers()
    print("topic\tpartition\tleader\tstatus\tearliest\tlatest\tepoch\treplicas\tisr")
    for topic in topics:
        cluster.leaders(topic)  # UnknownTopic if it does not exist
        for partition, replicas in sorted((cluster.metadata.assignment(topic) or {}).items()):
            current = read_partition_state(cluster.zk, topic, partition)
            state = current[0] if current else legacy_state(replicas)
            leader = live_leader(state, brokers)
            live = leader >= 0
            earliest = cluster.offset(topic, partition, EARLIEST) if live else None
            latest = cluster.offset(topic, partition, LATEST) if live else None
            where = f"{leader} ({brokers[leader].host}:{brokers[leader].port})" if live else "-1"
            print(f"{topic}\t{partition}\t{where}\t{'available' if live else 'OFFLINE'}\t{show(earliest)}\t"
                  f"{show(latest)}\t{state.leader_epoch}\t{_ids(replicas)}\t{_ids(state.isr)}")


def _ids(brokers: list[int]) -> str:
    return ",".join(map(str, brokers))
