"""The `/controller` node (docs/controller.md, "Who is the controller"): running for
controller, telling a live controller's node from one anyone else left there, and the
controller epoch. Every broker's `Controller` (`broker.server.controller`) runs through
these; the decisions it takes once elected live there.

The node counts only as the ephemeral node of the registered session of the broker it
names. On a cluster whose ZooKeeper root is not protected (docs/operations.md,
"Protecting the ZooKeeper root") anyone may replace it — by a persistent node, say,
that no session's end removes — and a controller that believed any node was another
broker's left the cluster without a controller once the real one died (issue 34)."""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoAuthError, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from broker.common.zklayout import CONTROLLER, CONTROLLER_EPOCH, broker_path, decode_controller, encode_controller

logger = logging.getLogger(__name__)


class Deposed(Exception):
    """`/controller_epoch` moved on: another broker is the controller now."""


def owns(zk: KazooClient, path: str) -> bool:
    """Whether the node at `path` is an ephemeral node of our session."""
    stat = zk.exists(path)
    return stat is not None and stat.ephemeralOwner == zk.client_id[0]


def foreign_controller_node(zk: KazooClient, data: bytes, stat: ZnodeStat) -> str | None:
    """Why the `/controller` node read as `data`, `stat` is not the controller's, or
    None when it is: the ephemeral node of the session that registered the broker it
    names. Read the node before the registration: a broker registers before it runs
    for controller and both nodes die with its session, so a controller's registration
    is there for as long as its node is."""
    if stat.ephemeralOwner == 0:
        return f"a persistent node {data[:60]!r}"
    try:
        broker_id = decode_controller(data)
    except (ValueError, KeyError, TypeError):
        return f"unreadable {data[:60]!r}"
    registration = zk.exists(broker_path(broker_id))
    if registration is None:
        return f"it names broker {broker_id}, which is not registered"
    if registration.ephemeralOwner != stat.ephemeralOwner:
        return f"it names broker {broker_id}, but another session owns it"
    return None


def claim_controller_node(zk: KazooClient, broker_id: int) -> ZnodeStat | None:
    """One run for controller: our `/controller` node's stat — created now, or left by
    a takeover that a failure cut short — or None while a live broker holds it. A
    foreign node is logged and deleted (None: the deletion's watch wakes us to run
    again); one we may not delete stays logged every try."""
    try:
        _, stat = zk.create(CONTROLLER, encode_controller(broker_id), ephemeral=True, makepath=True,
                            include_data=True)
        return stat
    except NodeExistsError:
        try:
            data, stat = zk.get(CONTROLLER)
        except NoNodeError:
            return None  # gone meanwhile: its watch wakes us
    if stat.ephemeralOwner == zk.client_id[0]:
        return stat  # ours
    problem = foreign_controller_node(zk, data, stat)
    if problem is None:
        return None  # another broker is the controller
    try:
        zk.delete(CONTROLLER, version=stat.version)
        logger.warning("controller: /controller is not a live broker's (%s): deleted it; electing a controller",
                       problem)
    except (NoNodeError, BadVersionError):
        pass  # replaced meanwhile: its watch wakes us to look again
    except NoAuthError:
        logger.error("controller: /controller is not a live broker's (%s), and we may not delete it: no broker can "
                     "be the controller until it is gone (protect the ZooKeeper root: docs/operations.md)", problem)
    return None


def bump_controller_epoch(zk: KazooClient) -> tuple[int, int]:
    """Increment `/controller_epoch` by compare-and-set: (the new epoch, the node's
    version), which every write of this controller checks."""
    while True:
        try:
            data, stat = zk.get(CONTROLLER_EPOCH)
        except NoNodeError:
            try:
                zk.create(CONTROLLER_EPOCH, b"1", makepath=True)
                return 1, 0
            except NodeExistsError:
                continue
        epoch = int(data.decode().strip()) + 1
        try:
            stat = zk.set(CONTROLLER_EPOCH, str(epoch).encode(), version=stat.version)
            return epoch, stat.version
        except BadVersionError:
            continue
