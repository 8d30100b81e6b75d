"""logbus's error codes as Kafka's (docs/kafka.md, "Errors"): the Kafka listener answers
a refusal with the code a Kafka client acts on — NOT_LEADER_OR_FOLLOWER makes it
refresh its metadata and retry, OUT_OF_ORDER_SEQUENCE_NUMBER ends an idempotent
producer, TOPIC_AUTHORIZATION_FAILED is not retried — so the mapping follows what each
code makes a client do, not only its name."""

from __future__ import annotations

from kio.schema.errors import ErrorCode as KafkaError

from broker.common.errors import ErrorCode

TO_KAFKA: dict[int, KafkaError] = {
    ErrorCode.NONE: KafkaError.none,
    ErrorCode.UNKNOWN: KafkaError.unknown_server_error,
    ErrorCode.OFFSET_OUT_OF_RANGE: KafkaError.offset_out_of_range,
    ErrorCode.INVALID_MESSAGE: KafkaError.corrupt_message,
    ErrorCode.UNKNOWN_PARTITION: KafkaError.unknown_topic_or_partition,
    ErrorCode.MESSAGE_TOO_LARGE: KafkaError.message_too_large,
    ErrorCode.UNKNOWN_TOPIC: KafkaError.unknown_topic_or_partition,
    ErrorCode.INVALID_TOPIC_NAME: KafkaError.invalid_topic_exception,
    ErrorCode.REQUEST_TOO_LARGE: KafkaError.record_list_too_large,
    ErrorCode.UNSUPPORTED_API: KafkaError.unsupported_version,
    ErrorCode.INVALID_REQUEST: KafkaError.invalid_request,
    ErrorCode.BROKER_SHUTTING_DOWN: KafkaError.not_leader_or_follower,  # retried elsewhere
    ErrorCode.NOT_LEADER_FOR_PARTITION: KafkaError.not_leader_or_follower,
    ErrorCode.TOPIC_ALREADY_EXISTS: KafkaError.topic_already_exists,
    ErrorCode.STORAGE_ERROR: KafkaError.kafka_storage_error,
    ErrorCode.TOPIC_CREATION_DISABLED: KafkaError.unknown_topic_or_partition,
    ErrorCode.NOT_ENOUGH_REPLICAS: KafkaError.not_enough_replicas,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: KafkaError.not_enough_replicas_after_append,
    ErrorCode.FENCED_LEADER_EPOCH: KafkaError.fenced_leader_epoch,
    ErrorCode.INVALID_REPLICATION_FACTOR: KafkaError.invalid_replication_factor,
    ErrorCode.PARTITION_OFFLINE: KafkaError.leader_not_available,
    ErrorCode.REQUEST_TIMED_OUT: KafkaError.request_timed_out,
    ErrorCode.OUT_OF_ORDER_SEQUENCE: KafkaError.out_of_order_sequence_number,
    ErrorCode.INVALID_PRODUCER_EPOCH: KafkaError.invalid_producer_epoch,
    ErrorCode.DUPLICATE_SEQUENCE: KafkaError.duplicate_sequence_number,
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: KafkaError.topic_authorization_failed,
    ErrorCode.GROUP_AUTHORIZATION_FAILED: KafkaError.group_authorization_failed,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: KafkaError.cluster_authorization_failed,
    ErrorCode.SASL_AUTHENTICATION_FAILED: KafkaError.sasl_authentication_failed,
    ErrorCode.UNSUPPORTED_SASL_MECHANISM: KafkaError.unsupported_sasl_mechanism,
    ErrorCode.ILLEGAL_SASL_STATE: KafkaError.illegal_sasl_state,
    ErrorCode.TOPIC_DELETION_DISABLED: KafkaError.topic_deletion_disabled,
}


def kafka_error(code: int) -> KafkaError:
    """The Kafka error code for a logbus one (UNKNOWN_SERVER_ERROR for any other)."""
    return TO_KAFKA.get(code, KafkaError.unknown_server_error)
