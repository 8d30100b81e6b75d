"""The controller's step for topics marked for deletion (docs/zookeeper.md, "Deleting a
topic"; Kafka's TopicDeletionManager, without its wait for every replica).

For each marker, the active controller
1. removes the topic's nodes — its partitions' state nodes, the partitions and the
   topic node — in transactions that check `/controller_epoch` is still its own, all
   in one while the topic has at most `STATE_NODES_PER_TRANSACTION / 3` partitions; every
   broker's watch then drops the topic from its metadata, stops serving and
   replicating it and removes its partition directories (`LogManager.remove_topic`);
2. removes what refers to it by name and would make a topic created again under that
   name start where the old one ended: the groups' committed offsets
   (`/consumers/<group>/offsets/<topic>`, native and Kafka groups alike) and the
   brokers' record counts (`/logbus_audit/<topic>`);
3. leaves the deleted incarnation's id as a tombstone (`/admin/deleted_topic_ids/<id>`)
   and removes the marker, which lets the name be created again.

Every step is idempotent, so a controller killed midway leaves the marker for the next
one, which does the rest. A replica that was down does not hold the deletion up: when
it comes back, its directories of a topic that is gone, or of an older incarnation
(another topic id), are removed before it serves (`LogManager.adopt`,
`LogManager.remove_strays`) — the reason topic ids exist (KIP-516).
"""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError, NoAuthError, NodeExistsError, NoNodeError, NotEmptyError, RolledBackError,
)

from broker.common.topicdeletion import DELETED_IDS, marked_topics, read_marker, tombstone_path
from broker.common.zklayout import (
    AUDIT, CONSUMERS, CONTROLLER_EPOCH, STATE_NODES_PER_TRANSACTION, decode_topic_id, deletion_path, partitions_path,
    topic_path,
)
from broker.server.controllernode import Deposed

logger = logging.getLogger(__name__)

UNREADABLE = "(unreadable)"


def readable_id(data: bytes) -> str | None:
    """The topic node's id; UNREADABLE for a node that is no topic's (garbage is deleted
    with the marker's topic rather than left to stop every controller pass)."""
    try:
        return decode_topic_id(data)
    except (ValueError, AttributeError):
        return UNREADABLE


class TopicDeleter:
    def __init__(self, zk: KazooClient) -> None:
        self.zk = zk

    def delete_marked(self, epoch_version: int) -> None:
        """Carry out every pending deletion, as the controller whose epoch node is at
        `epoch_version` (Deposed once it is not)."""
        for topic in marked_topics(self.zk):
            try:
                self.delete(topic, epoch_version)
            except Deposed:
                raise
            except Exception as exc:  # one deletion that cannot go on must not stop leader elections
                logger.warning("controller: deleting topic %s failed (%r); the next pass retries", topic, exc)

    def delete(self, topic: str, epoch_version: int) -> None:
        marker = read_marker(self.zk, topic)
        if marker is None:
            return
        try:
            data, _ = self.zk.get(topic_path(topic))
        except NoNodeError:
            data = None
        if data is not None and readable_id(data) not in (marker.topic_id, UNREADABLE):
            logger.warning("controller: the deletion of topic %s names topic id %s, but the topic now is %s: "
                           "dropping the stale marker", topic, marker.topic_id, decode_topic_id(data))
        else:
            if data is not None:
                self._remove_nodes(topic, epoch_version)
                logger.info("controller: deleted topic %s (topic id %s) from ZooKeeper", topic, marker.topic_id)
            self._remove_references(topic)
        if marker.topic_id is not None:  # its tombstone: the id of an incarnation that is gone for good
            self.zk.ensure_path(DELETED_IDS)
            try:
                self.zk.create(tombstone_path(marker.topic_id))
            except NodeExistsError:
                pass
        self._commit(epoch_version, [deletion_path(topic)], marker.version)
        logger.info("controller: deletion of topic %s is complete", topic)

    def _remove_nodes(self, topic: str, epoch_version: int) -> None:
        """Children before parents; the topic node in the last transaction."""
        paths = []
        for partition in self._children(partitions_path(topic)):
            where = f"{partitions_path(topic)}/{partition}"
            paths += [f"{where}/{child}" for child in self._children(where)] + [where]
        if self.zk.exists(partitions_path(topic)) is not None:
            paths.append(partitions_path(topic))
        paths.append(topic_path(topic))
        for start in range(0, len(paths), STATE_NODES_PER_TRANSACTION):
            self._commit(epoch_version, paths[start:start + STATE_NODES_PER_TRANSACTION])

    def _remove_references(self, topic: str) -> None:
        for group in self._children(CONSUMERS):
            self._remove_tree(f"{CONSUMERS}/{group}/offsets/{topic}")
        self._remove_tree(f"{AUDIT}/{topic}")

    def _remove_tree(self, path: str) -> None:
        try:
            self.zk.delete(path, recursive=True)
        except NoNodeError:
            pass
        except NotEmptyError:  # a writer added a child meanwhile: once more
            self.zk.delete(path, recursive=True)
        except NoAuthError:  # a client's node the cluster may not delete: the deletion goes on without it
            logger.error("controller: cannot delete %s (its ZooKeeper ACL refuses the brokers); it stays, and a "
                         "topic created again under the name would see it", path)

    def _commit(self, epoch_version: int, paths: list[str], last_version: int = -1) -> None:
        """Delete `paths` in one transaction guarded by the controller epoch (the last
        one at `last_version`). Nodes already gone are skipped: another pass, or a
        controller before us, removed them."""
        transaction = self.zk.transaction()
        transaction.check(CONTROLLER_EPOCH, epoch_version)
        present = [p for p in paths if self.zk.exists(p) is not None]
        for path in present:
            transaction.delete(path, last_version if path == paths[-1] else -1)
        epoch, *deleted = transaction.commit()
        if isinstance(epoch, (BadVersionError, NoNodeError)):
            raise Deposed()
        failed = [r for r in deleted if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if failed:
            raise failed[0]

    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self.zk.get_children(path))
        except NoNodeError:
            return []
