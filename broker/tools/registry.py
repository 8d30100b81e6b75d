"""`logbus schema-registry` (docs/schemas.md): start a schema registry process. It
finds the cluster's ZooKeeper through the common options (`--zookeeper`, and
`--command-config` for the cluster's ZooKeeper identity, which reads users'
credentials on a secured cluster) and serves until stopped; any number may run, on
any hosts, all equal."""

from __future__ import annotations

import argparse
import logging

from broker.common.passwords import ClusterCredentials
from broker.registry.access import Access
from broker.registry.api import Api
from broker.registry.server import MAX_BODY_BYTES, RegistryServer, Tls
from broker.registry.store import SchemaStore
from broker.registry.subjects import Subjects

logger = logging.getLogger(__name__)


def add_parser(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("schema-registry", parents=[common], help="serve the schema registry (Confluent's REST API)",
                       description="A schema registry whose state is in the cluster's ZooKeeper (docs/schemas.md).")
    p.add_argument("--listen", default="127.0.0.1:8081", metavar="HOST:PORT", help="where to serve (default %(default)s)")
    p.add_argument("--tls-certfile", help="serve HTTPS with this certificate (PEM, chain included)")
    p.add_argument("--tls-keyfile", help="the certificate's private key (PEM)")
    p.add_argument("--authenticate", choices=["none", "basic"], default="none",
                   help="basic: HTTP Basic against the cluster's SCRAM users, and ACLs on subjects (needs TLS)")
    p.add_argument("--super-user", action="append", default=[], metavar="User:NAME",
                   help="a principal allowed everything (repeatable)")
    p.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, help="largest request body (413 beyond)")
    p.set_defaults(run=cmd_schema_registry)


def server(args: argparse.Namespace, cluster) -> RegistryServer:
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen {args.listen!r}: write HOST:PORT")
    if bool(args.tls_certfile) != bool(args.tls_keyfile):
        raise ValueError("--tls-certfile and --tls-keyfile go together")
    if args.authenticate == "basic" and not args.tls_certfile:
        raise ValueError("--authenticate basic sends passwords: it needs HTTPS (--tls-certfile, --tls-keyfile)")
    zk_auth = cluster.zookeeper_auth
    credentials = ClusterCredentials(cluster.zk, zk_auth.private_acl) if args.authenticate == "basic" else None
    api = Api(Subjects(SchemaStore(cluster.zk, zk_auth.default_acl)), Access(credentials, tuple(args.super_user)))
    tls = Tls(args.tls_certfile, args.tls_keyfile) if args.tls_certfile else None
    return RegistryServer((host, int(port)), api, tls, args.max_body_bytes)


def cmd_schema_registry(args: argparse.Namespace, cluster) -> int:
    registry = server(args, cluster)
    scheme = "https" if args.tls_certfile else "http"
    logger.warning("schema registry serving %s://%s:%d (authentication: %s)", scheme, *registry.server_address[:2],
                   args.authenticate)
    print(f"schema registry serving {scheme}://{registry.server_address[0]}:{registry.server_address[1]}", flush=True)
    try:
        registry.serve_forever()
    finally:
        registry.server_close()
    return 0
