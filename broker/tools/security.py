"""`logbus users` and `logbus acls` (docs/operations.md, "Securing a cluster"): SCRAM
credentials and ACLs, written to ZooKeeper where every broker reads them. Passwords
are read from stdin or a file, never from the command line (other users see it in
`ps`); only salted keys are stored.

The common option `--command-config FILE` (Kafka's name) holds the client's security
properties (`broker.client.security`) and, for these commands, `zookeeper.auth`
(user:password of the brokers' ZooKeeper identity) and `zookeeper.set.acl`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from broker.client.security import OPEN, ClientSecurity
from broker.common.acls import (
    CLUSTER, AclEntry, Operation, PatternType, Permission, Resource, ResourceType, change_acls, parse_enum, read_acls,
)
from broker.common.credentials import MECHANISMS, delete_user, list_users, set_password
from broker.common.zkauth import NO_AUTH, ZooKeeperAuth

ZOOKEEPER_KEYS = ("zookeeper.auth", "zookeeper.set.acl")


def read_command_config(path: str | None) -> tuple[ClientSecurity, ZooKeeperAuth]:
    """The client security and the ZooKeeper identity of `--command-config`."""
    if not path:
        return OPEN, NO_AUTH
    properties = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read --command-config {path}: {exc.strerror}") from None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}:{number}: expected key=value")
        properties[key.strip()] = value.strip()
    zookeeper = {k: properties.pop(k) for k in ZOOKEEPER_KEYS if k in properties}
    security = ClientSecurity.from_properties(properties)
    tls = security.zookeeper()
    auth = ZooKeeperAuth(zookeeper.get("zookeeper.auth", ""),
                         zookeeper.get("zookeeper.set.acl", "false").lower() in ("true", "1", "yes"),
                         tls.tls_cafile, tls.tls_certfile, tls.tls_keyfile)
    return security, auth


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("users", parents=[common], help="add, change, delete or list SCRAM users",
                       description="SCRAM credentials in ZooKeeper. The password comes from stdin (one line) "
                                   "or --password-file; only salted keys are stored.")
    p.add_argument("action", choices=["add", "delete", "list"], help="add also changes a password")
    p.add_argument("user", nargs="?")
    p.add_argument("--password-file", help="read the password from this file's first line (default: stdin)")
    p.add_argument("--mechanism", action="append", choices=MECHANISMS,
                   help="store credentials for this mechanism (repeatable; default both)")
    p.set_defaults(run=cmd_users)

    p = sub.add_parser("acls", parents=[common], help="add, remove or list ACLs",
                       description="ACLs in ZooKeeper, watched by every broker (Kafka's kafka-acls).")
    action = p.add_mutually_exclusive_group(required=True)
    for name in ("add", "remove", "list"):
        action.add_argument(f"--{name}", dest="action", action="store_const", const=name)
    p.add_argument("--allow-principal", action="append", default=[], metavar="User:NAME")
    p.add_argument("--deny-principal", action="append", default=[], metavar="User:NAME")
    p.add_argument("--operation", action="append", default=[], metavar="OP",
                   help=f"one of {', '.join(o.value for o in Operation)} (repeatable)")
    p.add_argument("--host", default="*", help="the client address the entry applies to (default *: any)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--topic")
    which.add_argument("--group")
    which.add_argument("--subject", help="a schema registry subject (docs/schemas.md): Read, Write")
    which.add_argument("--cluster", action="store_true")
    p.add_argument("--resource-pattern-type", choices=[t.value for t in PatternType], default="literal",
                   help="literal: that name (or * for all); prefixed: every name starting with it")
    p.set_defaults(run=cmd_acls)


def cmd_users(args: argparse.Namespace, cluster) -> int:
    if args.action == "list":
        for user, mechanisms in list_users(cluster.zk).items():
            print(f"{user}\t{','.join(mechanisms)}")
        return 0
    if not args.user:
        raise ValueError(f"users {args.action} needs a user name")
    if args.action == "delete":
        if not delete_user(cluster.zk, args.user):
            raise ValueError(f"no user {args.user!r}")
        print(f"deleted user {args.user}")
        return 0
    source = open(args.password_file, encoding="utf-8") if args.password_file else sys.stdin
    with source:
        password = source.readline().rstrip("\r\n")
    set_password(cluster.zk, args.user, password, tuple(args.mechanism or MECHANISMS),
                 acl=cluster.zookeeper_auth.private_acl)
    print(f"credentials of {args.user} stored ({', '.join(args.mechanism or MECHANISMS)})")
    return 0


def _resource(args: argparse.Namespace) -> Resource | None:
    pattern = PatternType(args.resource_pattern_type)
    if args.topic is not None:
        return Resource(ResourceType.TOPIC, args.topic, pattern)
    if args.group is not None:
        return Resource(ResourceType.GROUP, args.group, pattern)
    if args.subject is not None:
        return Resource(ResourceType.SUBJECT, args.subject, pattern)
    if args.cluster:
        return Resource(ResourceType.CLUSTER, CLUSTER)
    return None


def cmd_acls(args: argparse.Namespace, cluster) -> int:
    resource = _resource(args)
    if args.action == "list":
        for acl in read_acls(cluster.zk):
            if resource is None or acl.resource == resource:
                print(acl)
        return 0
    if resource is None:
        raise ValueError("name the resource: --topic NAME, --group NAME, --subject NAME or --cluster")
    principals = [(p, Permission.ALLOW) for p in args.allow_principal] + \
                 [(p, Permission.DENY) for p in args.deny_principal]
    if not principals or not args.operation:
        raise ValueError("give at least one --allow-principal/--deny-principal and one --operation")
    for principal, _ in principals:
        if not principal.startswith("User:") or principal == "User:":
            raise ValueError(f"principal {principal!r}: write User:NAME (User:* for everyone)")
    entries = [AclEntry(principal, parse_enum(Operation, op), permission, args.host)
               for principal, permission in principals for op in args.operation]
    if args.action == "add":
        now = change_acls(cluster.zk, resource, add=entries, acl=cluster.zookeeper_auth.default_acl)
    else:
        now = change_acls(cluster.zk, resource, remove=entries)
    print(f"ACLs of {resource}: {len(now)} entr{'y' if len(now) == 1 else 'ies'}")
    for entry in now:
        print(f"  {entry.permission.value}\t{entry.principal}\t{entry.operation.value}\thost={entry.host}")
    return 0
