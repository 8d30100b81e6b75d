"""Command-line entry points: `logbus` operates a cluster (subcommands in
`broker.tools.admin`), `logbus-broker` starts a broker."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from broker.server.config import SECRET_KEYS, BrokerConfig, ConfigError, parse_overrides, read_properties

logger = logging.getLogger(__name__)


def broker_arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="logbus-broker",
        description="Start a logbus broker. Settings come from --config, then --set and the flags below.",
    )
    parser.add_argument("--config", action="append", default=[],
                        help="properties file (key=value lines); repeatable, later files win — passwords belong in "
                             "one only the broker's user may read (mode 0600)")
    parser.add_argument("--broker-id", type=int, help="broker.id")
    parser.add_argument("--host", help="host to bind and register (host)")
    parser.add_argument("--port", type=int, help="TCP port (port)")
    parser.add_argument("--log-dir", action="append", help="a log directory (log.dirs); repeat for several")
    parser.add_argument("--zookeeper", help="ZooKeeper connect string, host:port[/chroot] (zookeeper.connect)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any setting; repeatable")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return parser


def load_config(args: argparse.Namespace) -> BrokerConfig:
    settings: dict[str, str] = {}
    for path in args.config:
        settings.update(read_properties(Path(path)))
    overrides = parse_overrides(args.set)
    for key in sorted(SECRET_KEYS & overrides.keys()):
        logger.warning("%s is on the command line, which every local user may read; put it in a --config file "
                       "of mode 0600 instead", key)
    settings.update(overrides)
    flags = {
        "broker.id": args.broker_id, "host": args.host, "port": args.port, "zookeeper.connect": args.zookeeper,
        "log.dirs": ",".join(args.log_dir) if args.log_dir else None,
    }
    settings.update({k: str(v) for k, v in flags.items() if v is not None})
    return BrokerConfig.from_settings(settings)


def broker_main(argv: list[str] | None = None) -> int:
    args = broker_arguments().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s [%(name)s] %(message)s", stream=sys.stderr
    )
    try:
        config = load_config(args)
    except ConfigError as exc:
        print(f"logbus-broker: {exc}", file=sys.stderr)
        return 2
    from kazoo.handlers.threading import KazooTimeoutError

    from broker.server.broker import serve

    try:
        asyncio.run(serve(config))
    except KazooTimeoutError:
        print(f"logbus-broker: cannot reach ZooKeeper at {config.zookeeper_connect} within "
              f"{config.zookeeper_connection_timeout_ms} ms", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"logbus-broker: cannot start: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a clear line for operators; the traceback is in the log above
        logging.getLogger("broker").exception("broker failed")
        print(f"logbus-broker: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """`logbus`: topics, produce, consume, offsets, groups, perf (see `broker.tools.admin`)."""
    from broker.tools.admin import main as admin_main

    return admin_main(argv)


if __name__ == "__main__":
    sys.exit(broker_main())
