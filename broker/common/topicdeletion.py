"""Deleting a topic in ZooKeeper (docs/zookeeper.md, "Deleting a topic"): the marker a
deletion request writes and the active controller acts on (Kafka 0.8.2's
`/admin/delete_topics/<topic>`), naming the incarnation it deletes by its topic id
(KIP-516), so a marker never deletes a topic created again under the same name.

    /admin/delete_topics/<topic>    persistent {"topic_id": "<the incarnation's id>" | null}
    /admin/deleted_topic_ids/<id>   persistent empty: that incarnation was deleted

A marker is written by a broker that accepted a deletion (DELETE_TOPIC, Kafka's
DeleteTopics) and removed by the controller once the topic's nodes and what refers to
it are gone; while it exists the name cannot be created again
(`broker.common.zklayout.create_topic`). The deleted incarnation's id stays as a
tombstone: a broker that was down removes a partition directory of a topic that no
longer exists only when its id is one of them — a broker started against the wrong
ZooKeeper (a mistyped chroot) sees no topics, and must not take that for deletions."""

from __future__ import annotations

import json
from typing import NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from broker.common.errors import UnknownTopic
from broker.common.zklayout import DELETE_TOPICS, decode_topic_id, deletion_path, topic_path

DELETED_IDS = "/admin/deleted_topic_ids"


def tombstone_path(topic_id: str) -> str:
    return f"{DELETED_IDS}/{topic_id}"


class Marker(NamedTuple):
    """A pending deletion: the topic id it deletes (None: a topic from before ids) and
    the node's version, which the controller's removal of it checks."""

    topic_id: str | None
    version: int


def encode_marker(topic_id: str | None) -> bytes:
    return json.dumps({"topic_id": topic_id}).encode()


def decode_marker(data: bytes) -> str | None:
    return (json.loads(data) or {}).get("topic_id") if data else None


def mark_for_deletion(zk: KazooClient, topic: str) -> str | None:
    """Mark the topic's current incarnation for deletion; its topic id. A topic already
    marked stays marked (a repeated request is the same deletion); a topic that does not
    exist is UnknownTopic."""
    try:
        data, _ = zk.get(topic_path(topic))
    except NoNodeError:
        raise UnknownTopic(f"unknown topic {topic!r}") from None
    topic_id = decode_topic_id(data)
    try:
        zk.create(deletion_path(topic), encode_marker(topic_id), makepath=True)
    except NodeExistsError:
        pass
    return topic_id


def read_marker(zk: KazooClient, topic: str) -> Marker | None:
    """The topic's pending deletion, or None."""
    try:
        data, stat = zk.get(deletion_path(topic))
    except NoNodeError:
        return None
    try:
        return Marker(decode_marker(data), stat.version)
    except (ValueError, AttributeError):
        return Marker(None, stat.version)  # unreadable: it can only name a topic from before ids


def deleted_ids(zk: KazooClient) -> set[str]:
    """The ids of every topic incarnation deleted so far."""
    try:
        return set(zk.get_children(DELETED_IDS))
    except NoNodeError:
        return set()


def marked_topics(zk: KazooClient) -> list[str]:
    """The topics with a pending deletion, in name order."""
    try:
        return sorted(zk.get_children(DELETE_TOPICS))
    except NoNodeError:
        return []
