"""Error codes of the wire protocol (docs/protocol.md, "Error codes") and the exceptions
that carry them.

Server and clients share this module so that an error raised deep in the broker's log
reaches a client as the same exception class, with the broker's explanation attached.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    NONE = 0
    UNKNOWN = -1
    OFFSET_OUT_OF_RANGE = 1
    INVALID_MESSAGE = 2
    UNKNOWN_PARTITION = 3
    MESSAGE_TOO_LARGE = 4
    UNKNOWN_TOPIC = 5
    INVALID_TOPIC_NAME = 6
    REQUEST_TOO_LARGE = 7
    UNSUPPORTED_API = 8
    INVALID_REQUEST = 9
    BROKER_SHUTTING_DOWN = 10
    NOT_LEADER_FOR_PARTITION = 11
    TOPIC_ALREADY_EXISTS = 12
    STORAGE_ERROR = 13
    TOPIC_CREATION_DISABLED = 14
    NOT_ENOUGH_REPLICAS = 15
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 16
    FENCED_LEADER_EPOCH = 17
    INVALID_REPLICATION_FACTOR = 18
    PARTITION_OFFLINE = 19
    REQUEST_TIMED_OUT = 20
    OUT_OF_ORDER_SEQUENCE = 21
    INVALID_PRODUCER_EPOCH = 22
    DUPLICATE_SEQUENCE = 23
    TOPIC_AUTHORIZATION_FAILED = 24
    GROUP_AUTHORIZATION_FAILED = 25
    CLUSTER_AUTHORIZATION_FAILED = 26
    SASL_AUTHENTICATION_FAILED = 27
    UNSUPPORTED_SASL_MECHANISM = 28
    ILLEGAL_SASL_STATE = 29
    TOPIC_DELETION_DISABLED = 30


class LogbusError(Exception):
    """Base of every logbus error; `code` is what goes on the wire."""

    code: ErrorCode = ErrorCode.UNKNOWN


class OffsetOutOfRange(LogbusError):
    code = ErrorCode.OFFSET_OUT_OF_RANGE


class InvalidMessage(LogbusError):
    code = ErrorCode.INVALID_MESSAGE


class UnknownPartition(LogbusError):
    code = ErrorCode.UNKNOWN_PARTITION


class MessageTooLarge(LogbusError):
    code = ErrorCode.MESSAGE_TOO_LARGE


class UnknownTopic(LogbusError):
    code = ErrorCode.UNKNOWN_TOPIC


class TopicCreationDisabled(UnknownTopic):
    """The topic does not exist and this broker will not create it (`auto.create.topics`
    is off): retrying cannot help, so a producer fails such messages at once. A kind of
    UnknownTopic, so code that catches UnknownTopic still catches it."""

    code = ErrorCode.TOPIC_CREATION_DISABLED


class InvalidTopicName(LogbusError):
    code = ErrorCode.INVALID_TOPIC_NAME


class RequestTooLarge(LogbusError):
    code = ErrorCode.REQUEST_TOO_LARGE


class UnsupportedApi(LogbusError):
    code = ErrorCode.UNSUPPORTED_API


class InvalidRequest(LogbusError):
    code = ErrorCode.INVALID_REQUEST


class BrokerShuttingDown(LogbusError):
    code = ErrorCode.BROKER_SHUTTING_DOWN


class NotLeaderForPartition(LogbusError):
    code = ErrorCode.NOT_LEADER_FOR_PARTITION


class TopicAlreadyExists(LogbusError):
    code = ErrorCode.TOPIC_ALREADY_EXISTS


class StorageError(LogbusError):
    """The broker could not write to its log directory (full disk, I/O error, or the
    directory is offline until a probe finds it writable). Nothing of the refused
    request was appended, so a producer may retry it later without duplicates."""

    code = ErrorCode.STORAGE_ERROR


class NotEnoughReplicas(LogbusError):
    """acks=-1 refused before the append: the ISR is smaller than min.insync.replicas.
    Nothing was appended; a retry cannot duplicate."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS


class NotEnoughReplicasAfterAppend(LogbusError):
    """Appended on the leader, but the ISR shrank below min.insync.replicas before the
    messages were replicated. A retry may duplicate them."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


class FencedLeaderEpoch(LogbusError):
    """The request carries a leader epoch older than this broker's: its sender acts on
    stale leadership and must refresh it."""

    code = ErrorCode.FENCED_LEADER_EPOCH


class InvalidReplicationFactor(InvalidRequest):
    """More replicas asked for than there are live brokers, or fewer than one. A kind
    of InvalidRequest (what such a CREATE_TOPIC was refused with before replication)."""

    code = ErrorCode.INVALID_REPLICATION_FACTOR


class PartitionOffline(LogbusError):
    """The partition has no leader (no eligible replica is alive)."""

    code = ErrorCode.PARTITION_OFFLINE


class RequestTimedOut(LogbusError):
    """acks=-1: the messages were appended but not replicated to the ISR within
    timeout_ms. They may still become committed; a retry may duplicate them."""

    code = ErrorCode.REQUEST_TIMED_OUT


class OutOfOrderSequence(LogbusError):
    """An idempotent producer's batch whose first sequence is not the one after the
    last batch the partition holds from that producer (docs/clients.md, "Idempotence").
    Nothing was appended. Expected while an earlier batch of the same partition is
    being retried; otherwise the partition lost the producer's earlier batch."""

    code = ErrorCode.OUT_OF_ORDER_SEQUENCE


class InvalidProducerEpoch(LogbusError):
    """An idempotent producer's batch with an epoch older than the one the partition
    holds for that producer id: a fenced, stale sender. Nothing was appended."""

    code = ErrorCode.INVALID_PRODUCER_EPOCH


class DuplicateSequence(LogbusError):
    """An idempotent producer's batch that ends at or before the last sequence the
    partition holds from that producer, but is older than the batches it remembers
    with their offsets: already appended, so nothing was appended again. A producer
    counts it delivered (its offset is unknown)."""

    code = ErrorCode.DUPLICATE_SEQUENCE


class AuthorizationFailed(LogbusError):
    """Base of the refusals by ACL (docs/operations.md, "Securing a cluster"): the
    principal may not do this operation on this resource. Retrying cannot help."""


class TopicAuthorizationFailed(AuthorizationFailed):
    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED


class GroupAuthorizationFailed(AuthorizationFailed):
    code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class ClusterAuthorizationFailed(AuthorizationFailed):
    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class AuthenticationError(LogbusError):
    """Base of the handshake's refusals; the broker closes the connection after one.
    The text never says which part was wrong (user or password)."""


class SaslAuthenticationFailed(AuthenticationError):
    code = ErrorCode.SASL_AUTHENTICATION_FAILED


class UnsupportedSaslMechanism(AuthenticationError):
    code = ErrorCode.UNSUPPORTED_SASL_MECHANISM


class IllegalSaslState(AuthenticationError):
    """A request out of the handshake's order: anything but the handshake on a listener
    that authenticates, before authenticating."""

    code = ErrorCode.ILLEGAL_SASL_STATE


class TopicDeletionDisabled(LogbusError):
    """DELETE_TOPIC refused because `delete.topic.enable` is off on the broker asked."""

    code = ErrorCode.TOPIC_DELETION_DISABLED


class UnknownError(LogbusError):
    code = ErrorCode.UNKNOWN


_BY_CODE: dict[int, type[LogbusError]] = {
    cls.code: cls
    for cls in (
        OffsetOutOfRange, InvalidMessage, UnknownPartition, MessageTooLarge, UnknownTopic,
        InvalidTopicName, RequestTooLarge, UnsupportedApi, InvalidRequest, BrokerShuttingDown,
        NotLeaderForPartition, TopicAlreadyExists, StorageError, TopicCreationDisabled, NotEnoughReplicas,
        NotEnoughReplicasAfterAppend, FencedLeaderEpoch, InvalidReplicationFactor, PartitionOffline,
        RequestTimedOut, OutOfOrderSequence, InvalidProducerEpoch, DuplicateSequence, TopicAuthorizationFailed,
        GroupAuthorizationFailed, ClusterAuthorizationFailed, SaslAuthenticationFailed, UnsupportedSaslMechanism,
        IllegalSaslState, TopicDeletionDisabled, UnknownError,
    )
}


def error_for(code: int, message: str = "") -> LogbusError:
    """The exception for a wire error code; unknown codes become UnknownError."""
    cls = _BY_CODE.get(code, UnknownError)
    return cls(message or f"{cls.__name__} (error code {code})")
