"""Access control lists (docs/operations.md, "Securing a cluster"; Kafka's ACLs, KIP-11,
with prefixed names from KIP-290): the model, its ZooKeeper nodes, and the one rule
that decides. The broker's authorizer (`broker.server.auth.authorizer`) and
`logbus acls` share it, so what the command shows is what the brokers enforce.

An ACL entry allows or denies one principal one operation on resources named
literally or by prefix. A request is allowed when some entry allows it and none
denies it: deny beats allow; no entry is no permission. Read, Write, Delete and Alter
imply Describe, as in Kafka, so a consumer with Read sees its topic in METADATA.

Nodes: `/logbus_acls/<literal|prefixed>/<topic|group|cluster|subject>/<name>`, each a JSON
list of entries. One node per resource keeps an ACL change one compare-and-set and
lets brokers watch exactly what changed."""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass
from typing import Iterable
from urllib.parse import quote, unquote

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from broker.common.zklayout import ACLS

CLUSTER = "logbus-cluster"  # the one cluster resource's name, as in Kafka's kafka-cluster
WILDCARD = "*"  # a principal or a literal resource name that matches every one


class Operation(str, enum.Enum):
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DESCRIBE = "Describe"
    ALTER = "Alter"
    DELETE = "Delete"  # deleting a topic (DELETE_TOPIC, Kafka's DeleteTopics)
    DESCRIBE_CONFIGS = "DescribeConfigs"  # a topic's or the broker's settings (the Kafka listener)
    CLUSTER_ACTION = "ClusterAction"
    ALL = "All"


class ResourceType(str, enum.Enum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"
    SUBJECT = "subject"  # a schema registry subject (docs/schemas.md, "Security")


class PatternType(str, enum.Enum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Permission(str, enum.Enum):
    ALLOW = "allow"
    DENY = "deny"


_IMPLIES_DESCRIBE = {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER, Operation.ALL}


def parse_enum(kind: type[enum.Enum], text: str) -> enum.Enum:
    """An enum member by its value, case-insensitively, or a ValueError listing them."""
    for member in kind:
        if member.value.lower() == text.strip().lower():
            return member
    raise ValueError(f"unknown {kind.__name__} {text!r}: use one of {', '.join(m.value for m in kind)}")


@dataclass(frozen=True)
class Resource:
    type: ResourceType
    name: str
    pattern: PatternType = PatternType.LITERAL

    def __post_init__(self) -> None:
        if not self.name:  # a prefixed "" would match everything and has no node of its own
            raise ValueError(f"an empty resource name: name the {self.type.value}")

    def matches(self, resource_type: ResourceType, name: str) -> bool:
        if resource_type != self.type:
            return False
        if self.pattern == PatternType.PREFIXED:
            return name.startswith(self.name)
        return self.name in (name, WILDCARD)

    @property
    def path(self) -> str:
        return f"{ACLS}/{self.pattern.value}/{self.type.value}/{quote(self.name, safe='')}"

    def __str__(self) -> str:
        return f"{self.type.value}:{self.name}" + ("*" if self.pattern == PatternType.PREFIXED else "")


@dataclass(frozen=True)
class AclEntry:
    principal: str  # "User:alice", "User:CN=broker-0,O=example", or "User:*"
    operation: Operation
    permission: Permission = Permission.ALLOW
    host: str = WILDCARD

    def matches(self, principal: str, operation: Operation, host: str) -> bool:
        if self.principal not in (principal, f"User:{WILDCARD}") or self.host not in (host, WILDCARD):
            return False
        if self.operation in (operation, Operation.ALL):
            return True
        # an allow of Read/Write/Alter lets a principal see what it may use; a deny of
        # them denies only them
        return (operation == Operation.DESCRIBE and self.permission == Permission.ALLOW
                and self.operation in _IMPLIES_DESCRIBE)


@dataclass(frozen=True)
class Acl:
    """One entry on one resource: what `logbus acls --list` prints a line for."""

    resource: Resource
    entry: AclEntry

    def __str__(self) -> str:
        e = self.entry
        return f"{self.resource}\t{e.permission.value}\t{e.principal}\t{e.operation.value}\thost={e.host}"


def decide(acls: Iterable[Acl], principal: str, operation: Operation, resource_type: ResourceType, name: str,
           host: str = WILDCARD) -> bool | None:
    """True (allowed), False (denied by an entry) or None (no entry matches). Deny beats
    allow."""
    allowed = None
    for acl in acls:
        if not acl.resource.matches(resource_type, name) or not acl.entry.matches(principal, operation, host):
            continue
        if acl.entry.permission == Permission.DENY:
            return False
        allowed = True
    return allowed


def encode_entries(entries: Iterable[AclEntry]) -> bytes:
    return json.dumps([{k: getattr(v, "value", v) for k, v in asdict(e).items()} for e in entries],
                      sort_keys=True).encode()


def decode_entries(data: bytes) -> list[AclEntry]:
    return [AclEntry(str(e["principal"]), Operation(e["operation"]), Permission(e["permission"]),
                     str(e.get("host", WILDCARD))) for e in json.loads(data)]


def resource_from_path(pattern: str, resource_type: str, name: str) -> Resource:
    return Resource(ResourceType(resource_type), unquote(name), PatternType(pattern))


def read_acls(zk: KazooClient) -> list[Acl]:
    """Every ACL in ZooKeeper (unreadable nodes skipped: the caller logs them)."""
    acls = []
    for pattern in _children(zk, ACLS):
        for resource_type in _children(zk, f"{ACLS}/{pattern}"):
            for name in _children(zk, f"{ACLS}/{pattern}/{resource_type}"):
                try:
                    resource = resource_from_path(pattern, resource_type, name)
                    data, _ = zk.get(resource.path)
                    acls += [Acl(resource, entry) for entry in decode_entries(data)]
                except (NoNodeError, ValueError, KeyError, TypeError):
                    continue
    return acls


def _children(zk: KazooClient, path: str) -> list[str]:
    try:
        return sorted(zk.get_children(path))
    except NoNodeError:
        return []


def change_acls(zk: KazooClient, resource: Resource, add: Iterable[AclEntry] = (),
                remove: Iterable[AclEntry] = (), acl=None) -> list[AclEntry]:
    """Add and remove entries of one resource by compare-and-set (two admins at once
    lose nothing); the node goes when its last entry does. Returns the new entries."""
    add, remove = list(add), set(remove)
    while True:
        try:
            data, stat = zk.get(resource.path)
            current, version = decode_entries(data), stat.version
        except NoNodeError:
            current, version = [], None
        entries = [e for e in current if e not in remove]
        entries += [e for e in add if e not in entries]
        try:
            if version is None:
                if entries:
                    zk.create(resource.path, encode_entries(entries), acl=acl, makepath=True)
            elif entries:
                zk.set(resource.path, encode_entries(entries), version=version)
            else:
                zk.delete(resource.path, version=version)
            return entries
        except (BadVersionError, NodeExistsError, NoNodeError):
            continue  # someone else changed it meanwhile: read again
