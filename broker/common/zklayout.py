"""The ZooKeeper layout (docs/zookeeper.md, a contract): paths, node codecs, offsets.

    /brokers/ids/<id>                                ephemeral  {"host","port","version","endpoints","principal"}
    /brokers/topics/<topic>                          persistent {"partitions": {"0": [2, 0, 1], ...}, "topic_id": "..."}
    /brokers/topics/<topic>/partitions/<p>/state     persistent {"leader","leader_epoch","isr",
                                                                 "controller_epoch","version"}
    /controller                                      ephemeral  {"broker_id": 1}
    /controller_epoch                                persistent controller epoch (decimal)
    /consumers/<group>/ids/<consumer_id>             ephemeral  {"<topic>": <streams>}
    /consumers/<group>/owners/<topic>/<partition>    ephemeral  owning stream id
    /consumers/<group>/offsets/<topic>/<partition>   persistent next offset (decimal)
    /consumers/<group>/kafka                         persistent a Kafka group's {"generation","protocol_type","protocol"}
    /latest_producer_id_block                        persistent {"broker","block_start","block_end"}
    /admin/delete_topics/<topic>                     persistent a deletion's marker (broker.common.topicdeletion)
    /logbus_mirror/<name>/<source>/<topic>/<p>       persistent a mirror's checkpoint (broker.client.mirror)
    /logbus_acls/<pattern>/<resource type>/<name>    persistent [ACL entries] (broker.common.acls)
    /logbus_users/<user>                             persistent salted SCRAM credentials (broker.common.credentials)
    /logbus_audit/<topic>/<p>                        persistent the brokers' record counts (broker.common.auditcounts)
    /logbus_schemas/...                              persistent the schema registry's (broker.registry.store)

The one module that knows these paths and how their nodes are encoded: brokers
(`broker.server.registration`), clients (`broker.client`), the `logbus` command and the
provider all go through it, so the contract lives in one place.
"""

from __future__ import annotations

import json
import logging
import uuid
import zlib
from dataclasses import dataclass, field
from typing import NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from broker.common.errors import InvalidReplicationFactor, TopicAlreadyExists, UnknownError
from broker.common.listeners import Endpoint
from broker.common.protocol import BrokerInfo, check_topic_name

logger = logging.getLogger(__name__)

BROKER_IDS = "/brokers/ids"
BROKER_TOPICS = "/brokers/topics"
CONSUMERS = "/consumers"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
PRODUCER_ID_BLOCK_SIZE = 1000  # ids per block; one for the whole cluster (claims multiply zxids by it)
MIRRORS = "/logbus_mirror"
ACLS = "/logbus_acls"
USERS = "/logbus_users"
AUDIT = "/logbus_audit"
SCHEMAS = "/logbus_schemas"
DELETE_TOPICS = "/admin/delete_topics"  # Kafka's path for the markers of topics being deleted


# --------------------------------------------------------------------------- paths


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}"


def deletion_path(topic: str) -> str:
    return f"{DELETE_TOPICS}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions/{partition}/state"


def controller_path() -> str:
    return CONTROLLER


def controller_epoch_path() -> str:
    return CONTROLLER_EPOCH


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


def kafka_group_path(group: str) -> str:
    """A Kafka-protocol group's generation, kept by its coordinator (docs/kafka.md)."""
    return f"{CONSUMERS}/{group}/kafka"


def mirror_checkpoint_path(mirror: str, source: str, topic: str, partition: int) -> str:
    return f"{MIRRORS}/{mirror}/{source}/{topic}/{partition}"


def offset_path(group: str, topic: str, partition: int) -> str:
    return f"{CONSUMERS}/{group}/offsets/{topic}/{partition}"


# -------------------------------------------------------------------------- codecs

Assignment = dict[int, list[int]]  # partition -> replica broker ids, leader first


def encode_assignment(assignment: Assignment, topic_id: str | None = None) -> bytes:
    node: dict[str, object] = {"partitions": {str(p): r for p, r in sorted(assignment.items())}}
    return json.dumps(node | ({"topic_id": topic_id} if topic_id else {})).encode()


def decode_assignment(data: bytes) -> Assignment:
    return {int(p): [int(b) for b in replicas] for p, replicas in json.loads(data)["partitions"].items()}


def decode_topic_id(data: bytes) -> str | None:
    """The incarnation of a topic (KIP-516): a name deleted and created again gets a new
    id, so a replica that missed the deletion tells its old data from the new topic's.
    None for topics created before ids."""
    return json.loads(data).get("topic_id") or None


@dataclass(frozen=True)
class PartitionState:
    """Who leads a partition, in which leader epoch, and which replicas are in sync.
    `leader` -1: offline (no eligible replica). Written at topic creation, then only by
    compare-and-set: by the controller (leader changes) and by the leader (ISR changes)."""

    leader: int
    leader_epoch: int = 0
    isr: list[int] = field(default_factory=list)
    controller_epoch: int = 0
    version: int = 1

    OFFLINE = -1

    def encode(self) -> bytes:
        return json.dumps({
            "leader": self.leader, "leader_epoch": self.leader_epoch, "isr": list(self.isr),
            "controller_epoch": self.controller_epoch, "version": self.version,
        }).encode()

    @classmethod
    def decode(cls, data: bytes) -> "PartitionState":
        node = json.loads(data)
        return cls(
            int(node["leader"]), int(node["leader_epoch"]), [int(b) for b in node["isr"]],
            int(node.get("controller_epoch", 0)), int(node.get("version", 1)),
        )

    @classmethod
    def initial(cls, replicas: list[int]) -> "PartitionState":
        """A new partition's state: the preferred (first) replica leads, all are in sync."""
        return cls(replicas[0], 0, list(replicas))


def encode_controller(broker_id: int) -> bytes:
    return json.dumps({"broker_id": broker_id}).encode()


def decode_controller(data: bytes) -> int:
    return int(json.loads(data)["broker_id"])


def encode_broker(broker: BrokerInfo, version: str) -> bytes:
    """host and port: the inter-broker listener's advertised address; endpoints: every
    listener's; principal: who the broker authenticates as, so that a leader can tell
    a follower's fetch from a client's that names the follower (docs/zookeeper.md)."""
    node = {"host": broker.host, "port": broker.port, "version": version}
    if broker.endpoints:
        node["endpoints"] = [str(e) for e in broker.endpoints]
    if broker.principal:
        node["principal"] = broker.principal
    return json.dumps(node).encode()


def decode_broker(broker_id: int, data: bytes) -> BrokerInfo:
    info = json.loads(data)
    endpoints = tuple(Endpoint.parse(e) for e in info.get("endpoints", ()))
    return BrokerInfo(broker_id, info["host"], int(info["port"]), endpoints, str(info.get("principal", "")))


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


def assign_round_robin(topic: str, partitions: int, broker_ids: list[int], replication_factor: int = 1) -> Assignment:
    """Spread partitions and their replicas over the live brokers, preferred leader first.

    Leaders go round-robin from a start that depends on the topic (a stable hash), so
    that many small topics do not all lead on the lowest id. A partition's followers
    follow its leader at a shift that grows every len(brokers) partitions (Kafka's
    placement), so the followers of one broker's partitions spread over the others and
    a broker's loss moves its leaderships to several brokers, not one. Replicas of a
    partition are distinct brokers; `replication_factor` must be 1..len(broker_ids)."""
    if not broker_ids:
        raise UnknownError("no live brokers to assign partitions to")
    if not 1 <= replication_factor <= len(broker_ids):
        raise InvalidReplicationFactor(
            f"replication factor {replication_factor} for topic {topic!r}: must be 1..{len(broker_ids)} "
            f"(the number of live brokers: {sorted(broker_ids)})"
        )
    ids = sorted(broker_ids)
    n = len(ids)
    start = zlib.crc32(topic.encode()) % n
    assignment = {}
    for p in range(partitions):
        first = (start + p) % n
        shift = (start + p // n) % (n - 1) if n > 1 else 0
        followers = [(first + 1 + (shift + j) % (n - 1)) % n for j in range(replication_factor - 1)]
        assignment[p] = [ids[first]] + [ids[i] for i in followers]
    return assignment


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


STATE_NODES_PER_TRANSACTION = 500  # ZooKeeper bounds a request (jute.maxbuffer, 1 MB)


def create_topic(zk: KazooClient, topic: str, partitions: int, replication_factor: int = 1,
                 topic_id: str | None = None) -> Assignment:
    """Write a topic's assignment and the first state node of each partition (leader =
    first replica, epoch 0, ISR = all replicas) in one transaction, so no reader sees
    the topic without its state; a concurrent creator gets TopicAlreadyExists. Past
    STATE_NODES_PER_TRANSACTION partitions the rest follow in further transactions —
    meanwhile such a partition reads as a topic from before replication (leader =
    first replica), which is the same leader."""
    check_topic_name(topic)
    live = sorted(read_brokers(zk))
    assignment = assign_round_robin(topic, partitions, live, replication_factor)
    zk.ensure_path(BROKER_TOPICS)
    zk.ensure_path(DELETE_TOPICS)
    first = True
    items = sorted(assignment.items())
    for start in range(0, len(items), STATE_NODES_PER_TRANSACTION):
        transaction = zk.transaction()
        if first:  # the marker created and deleted: the creation fails while a deletion of the name is pending
            transaction.create(topic_path(topic), encode_assignment(assignment, topic_id or uuid.uuid4().hex))
            transaction.create(deletion_path(topic))
            transaction.delete(deletion_path(topic))
            transaction.create(partitions_path(topic))
        for partition, replicas in items[start:start + STATE_NODES_PER_TRANSACTION]:
            transaction.create(f"{partitions_path(topic)}/{partition}")
            transaction.create(partition_state_path(topic, partition), PartitionState.initial(replicas).encode())
        results = transaction.commit()
        failed = [r for r in results if isinstance(r, Exception)]
        if first and isinstance(results[0], NodeExistsError):
            raise TopicAlreadyExists(f"topic {topic!r} already exists") from None
        if first and isinstance(results[1], NodeExistsError):
            raise TopicAlreadyExists(f"topic {topic!r} is marked for deletion: create it once that is done") from None
        if failed:
            raise UnknownError(f"creating topic {topic!r} in ZooKeeper failed: {failed[0]!r}")
        first = False
    logger.info("created topic %s with replication factor %d: %s", topic, replication_factor, assignment)
    return assignment


# ------------------------------------------------------------------ partition state


class StateNode(NamedTuple):
    """A partition's state as read, with the znode's `version` (for compare-and-set)
    and `mzxid`, the ZooKeeper transaction id of its last write: a broker registered
    after that write (a larger registration czxid) restarted or lost its session since,
    so it cannot have been judged fit to lead the epoch the node names (KIP-101)."""

    state: PartitionState
    version: int
    mzxid: int = 0


def read_partition_state(zk: KazooClient, topic: str, partition: int) -> StateNode | None:
    """A partition's state node. A partition of a topic created before replication has
    no state node: it reads as led by its first replica, alone in sync, epoch 0, with
    version -1 (a CAS write then creates the node). None if the partition does not exist."""
    try:
        data, stat = zk.get(partition_state_path(topic, partition))
        return StateNode(PartitionState.decode(data), stat.version, stat.mzxid)
    except NoNodeError:
        pass
    assignment = read_assignment(zk, topic)
    if not assignment or partition not in assignment:
        return None
    leader = assignment[partition][0]
    return StateNode(PartitionState(leader, 0, [leader]), -1)


def write_partition_state(zk: KazooClient, topic: str, partition: int, state: PartitionState,
                          version: int) -> int | None:
    """Compare-and-set a partition's state: write it only if the node is still at
    `version` (-1: only if there is no node yet). The new znode version, or None if
    another writer got there first — the caller re-reads and decides again."""
    path = partition_state_path(topic, partition)
    try:
        if version == -1:
            if zk.exists(topic_path(topic)) is None:
                return None  # deleted: creating its parents would bring back an empty topic node
            zk.create(path, state.encode(), makepath=True)
            return 0
        return zk.set(path, state.encode(), version=version).version
    except (BadVersionError, NodeExistsError):
        logger.info("state of %s-%d changed under us (we had version %d); re-reading", topic, partition, version)
        return None


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
