"""The ZooKeeper layout (DESIGN §5, a contract): paths, node codecs, offsets.

    /brokers/ids/<id>                                ephemeral  {"host","port","version"}
    /brokers/topics/<topic>                          persistent {"partitions": {"0": [2], ...}}
    /consumers/<group>/ids/<consumer_id>             ephemeral  {"<topic>": <streams>}
    /consumers/<group>/owners/<topic>/<partition>    ephemeral  owning stream id
    /consumers/<group>/offsets/<topic>/<partition>   persistent next offset (decimal)

The one module that knows these paths and how their nodes are encoded: brokers
(`broker.registration`), clients (`broker.client`), the `logbus` command and the
provider all go through it, so the contract lives in one place.
"""

from __future__ import annotations

import json
import logging
import zlib

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from broker.errors import TopicAlreadyExists, UnknownError
from broker.protocol import BrokerInfo, check_topic_name

logger = logging.getLogger(__name__)

BROKER_IDS = "/brokers/ids"
BROKER_TOPICS = "/brokers/topics"
CONSUMERS = "/consumers"


# --------------------------------------------------------------------------- paths


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}"


def group_path(group: str) -> str:
    return f"{CONSUMERS}/{group}"


def group_ids_path(group: str) -> str:
    return f"{CONSUMERS}/{group}/ids"


def consumer_path(group: str, consumer_id: str) -> str:
    return f"{CONSUMERS}/{group}/ids/{consumer_id}"


def owners_path(group: str) -> str:
    return f"{CONSUMERS}/{group}/owners"


def owner_path(group: str, topic: str, partition: int) -> str:
    return f"{CONSUMERS}/{group}/owners/{topic}/{partition}"


def offsets_path(group: str) -> str:
    return f"{CONSUMERS}/{group}/offsets"


def offset_path(group: str, topic: str, partition: int) -> str:
    return f"{CONSUMERS}/{group}/offsets/{topic}/{partition}"


# -------------------------------------------------------------------------- codecs

Assignment = dict[int, list[int]]  # partition -> replica broker ids, leader first


def encode_assignment(assignment: Assignment) -> bytes:
    return json.dumps({"partitions": {str(p): r for p, r in sorted(assignment.items())}}).encode()


def decode_assignment(data: bytes) -> Assignment:
    return {int(p): [int(b) for b in replicas] for p, replicas in json.loads(data)["partitions"].items()}


def encode_broker(broker: BrokerInfo, version: str) -> bytes:
    return json.dumps({"host": broker.host, "port": broker.port, "version": version}).encode()


def decode_broker(broker_id: int, data: bytes) -> BrokerInfo:
    info = json.loads(data)
    return BrokerInfo(broker_id, info["host"], int(info["port"]))


def encode_subscription(topics: dict[str, int]) -> bytes:
    """A consumer's registration: {topic: number of streams}."""
    return json.dumps(topics).encode()


def decode_subscription(data: bytes) -> dict[str, int]:
    return {t: int(n) for t, n in json.loads(data).items()}


def encode_offset(offset: int) -> bytes:
    return str(int(offset)).encode()


def decode_offset(data: bytes) -> int:
    """The next offset stored in an offset node; ValueError if it is not a number."""
    return int(data.decode().strip())


# ------------------------------------------------------------------ brokers, topics


def assign_round_robin(topic: str, partitions: int, broker_ids: list[int]) -> Assignment:
    """Spread partitions over the live brokers; the starting broker depends on the topic
    (a stable hash) so that many small topics do not all lead on the lowest id."""
    if not broker_ids:
        raise UnknownError("no live brokers to assign partitions to")
    ids = sorted(broker_ids)
    start = zlib.crc32(topic.encode()) % len(ids)
    return {p: [ids[(start + p) % len(ids)]] for p in range(partitions)}


def read_brokers(zk: KazooClient, children: list[str] | None = None) -> dict[int, BrokerInfo]:
    """The live brokers (of `children` of /brokers/ids, if a watch already listed them);
    nodes that vanish meanwhile or are not ours are skipped."""
    brokers = {}
    for child in zk.get_children(BROKER_IDS) if children is None else children:
        try:
            brokers[int(child)] = decode_broker(int(child), zk.get(broker_path(int(child)))[0])
        except (NoNodeError, ValueError, KeyError):
            continue
    return brokers


def read_assignment(zk: KazooClient, topic: str) -> Assignment | None:
    """The topic's assignment; None if the topic does not exist."""
    try:
        data, _ = zk.get(topic_path(topic))
    except NoNodeError:
        return None
    return decode_assignment(data)


def create_topic(zk: KazooClient, topic: str, partitions: int) -> Assignment:
    """Write a topic's assignment once; a concurrent creator gets TopicAlreadyExists."""
    check_topic_name(topic)
    assignment = assign_round_robin(topic, partitions, list(read_brokers(zk)))
    try:
        zk.create(topic_path(topic), encode_assignment(assignment), makepath=True)
    except NodeExistsError:
        raise TopicAlreadyExists(f"topic {topic!r} already exists") from None
    logger.info("created topic %s: %s", topic, assignment)
    return assignment


# -------------------------------------------------------------------- group offsets


def read_offset(zk: KazooClient, group: str, topic: str, partition: int) -> int | None:
    """The group's committed next offset; None if it has none (or an unreadable one)."""
    try:
        data, _ = zk.get(offset_path(group, topic, partition))
    except NoNodeError:
        return None
    try:
        return decode_offset(data)
    except ValueError:
        logger.error("ignoring unreadable offset %r of group %s at %s-%d", data[:40], group, topic, partition)
        return None


def write_offset(zk: KazooClient, group: str, topic: str, partition: int, offset: int) -> None:
    """Store the group's next offset, whatever was there (the group's owner commits)."""
    path = offset_path(group, topic, partition)
    data = encode_offset(offset)
    try:
        zk.set(path, data)
    except NoNodeError:
        try:
            zk.create(path, data, makepath=True)
        except NodeExistsError:
            zk.set(path, data)


def advance_offset(zk: KazooClient, group: str, topic: str, partition: int, offset: int,
                   attempts: int = 20) -> bool:
    """Move the group's offset forward to `offset`, never back, with compare-and-set:
    concurrent writers (overlapping runs that mirror a load) are expected, and a version
    conflict re-reads the node and tries again until the stored offset is at or past
    ours. False if it gave up after `attempts` conflicts."""
    path = offset_path(group, topic, partition)
    for _ in range(attempts):
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            try:
                zk.create(path, encode_offset(offset), makepath=True)
                return True
            except NodeExistsError:
                continue
        try:
            current = decode_offset(data)
        except ValueError:
            current = -1
        if current >= offset:
            return True
        try:
            zk.set(path, encode_offset(offset), version=stat.version)
            return True
        except BadVersionError:
            logger.info("group offset %s changed while advancing it to %d; reading it again", path, offset)
    logger.warning("gave up advancing group offset %s to %d after %d concurrent updates", path, offset, attempts)
    return False
