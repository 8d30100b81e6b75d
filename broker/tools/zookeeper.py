"""`logbus zookeeper protect-root` (docs/operations.md, "Protecting the ZooKeeper root"):
makes the cluster's ZooKeeper root — the chroot of `--zookeeper` — its own, so that
only the cluster's digest identity may create or delete the nodes under it; with
`--copy-from`, first copies a cluster kept elsewhere (at ZooKeeper's own root, as
secured clusters were before issue 34) under it. Brokers protect an open chroot
themselves when they start; this command does it without a restart, and moves a
cluster, which they cannot do.

It needs the cluster's identity (`zookeeper.auth` in `--command-config`), and opens
its own ZooKeeper clients: the other commands' metadata would create nodes under a
root that may not exist yet."""

from __future__ import annotations

import argparse
import contextlib
from typing import Iterator

from kazoo.client import KazooClient

from broker.client.metadata import connect_zookeeper
from broker.common.zkauth import ZooKeeperAuth, protect_root
from broker.common.zklayout import ACLS, BROKER_IDS, CONSUMERS, CONTROLLER_EPOCH, MIRRORS, PRODUCER_ID_BLOCK, USERS
from broker.tools.security import read_command_config

# the cluster's persistent nodes at its root; `/controller` and the brokers' registrations
# are ephemeral and made again by the brokers
CLUSTER_NODES = ("/brokers", CONTROLLER_EPOCH, PRODUCER_ID_BLOCK, CONSUMERS, MIRRORS, ACLS, USERS)


def add_parser(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("zookeeper", parents=[common], help="protect (or move) the cluster's ZooKeeper root",
                       description="Make the chroot of --zookeeper the cluster's own: only the cluster's identity "
                                   "(zookeeper.auth in --command-config) may create or delete the nodes under it.")
    p.add_argument("action", choices=["protect-root"])
    p.add_argument("--copy-from", metavar="PATH",
                   help="first copy the cluster's persistent nodes from PATH of the same ZooKeeper (/ for its own "
                        "root); the brokers there must be stopped")
    p.set_defaults(run=protect_root_command, own_connection=True)


def protect_root_command(args: argparse.Namespace, cluster: None = None) -> int:
    from broker.tools.admin import zookeeper_of  # admin imports this module

    connect = zookeeper_of(args)
    _, given = read_command_config(args.command_config)
    if not given.digest:
        raise ValueError("protect-root needs the cluster's identity: zookeeper.auth=user:password in --command-config")
    auth = ZooKeeperAuth(given.digest, True, given.tls_cafile, given.tls_certfile, given.tls_keyfile)
    hosts, _, chroot = connect.partition("/")
    root = "/" + chroot.strip("/")
    source = "/" + (args.copy_from or "").strip("/")
    if args.copy_from is not None and source == root != "/":  # no chroot at all: protect_root says what to do
        raise ValueError(f"--copy-from {args.copy_from} is the cluster's root itself")
    with _client(connect, args.zookeeper_timeout, auth) as zk:
        print(protect_root(zk, auth) or f"the ZooKeeper root {root} is the cluster's own already")
        if args.copy_from is not None:
            with _client(hosts + source.rstrip("/"), args.zookeeper_timeout, auth) as old:
                copied, kept = copy_cluster(old, zk)
            print(f"copied {copied} nodes of the cluster from {source} to {root} ({kept} were there already); "
                  f"start the brokers, and point every client, at {connect}")
    return 0


@contextlib.contextmanager
def _client(connect: str, timeout: float, auth: ZooKeeperAuth) -> Iterator[KazooClient]:
    zk = connect_zookeeper(connect, timeout, auth=auth)
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


def copy_cluster(source: KazooClient, target: KazooClient) -> tuple[int, int]:
    """Copy the cluster's persistent nodes (`CLUSTER_NODES` and below: data and ACLs)
    from `source` to `target`: (nodes copied, nodes the target had already, left as
    they were — a copy cut short is finished by running it again). Refused while a
    broker is registered at the source: a running cluster keeps changing them."""
    running = source.get_children(BROKER_IDS) if source.exists(BROKER_IDS) else []
    if running:
        raise ValueError(f"brokers {', '.join(sorted(running))} are still registered at the source: stop them first")
    copied = kept = 0
    pending = [path for path in CLUSTER_NODES if source.exists(path)]
    while pending:
        path = pending.pop()
        data, stat = source.get(path)
        if stat.ephemeralOwner:
            continue
        if target.exists(path):
            kept += 1
        else:
            target.create(path, data, acl=source.get_acls(path)[0])
            copied += 1
        pending += [f"{path}/{child}" for child in source.get_children(path)]
    return copied, kept
