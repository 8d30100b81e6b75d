"""Errors raised by the clients themselves (not carried on the wire).

They subclass `LogbusError` so a caller (the `logbus` command, the Airflow hook) can
catch every logbus failure with one clause and show its message as it is.
"""

from __future__ import annotations

import logging

from broker.common.errors import LogbusError
from broker.common.message import CorruptEntry

logger = logging.getLogger(__name__)


class ClientError(LogbusError):
    """A client-side failure; the message says what to check."""


class ZooKeeperUnavailable(ClientError):
    """ZooKeeper could not be reached within the connect timeout."""


class NoBrokersAvailable(ClientError):
    """None of the given or registered brokers answered."""


class PartitionUnavailable(ClientError):
    """The partition has no live leader (its broker is down) within the retry time."""


class ProduceError(ClientError):
    """A sync `send` that failed after its retries; `cause` is the last broker error."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class MirrorRefused(ClientError):
    """The mirror (`broker.client.mirror`) met what retrying cannot fix — a missing
    topic the target will not create, no permission to read, write or checkpoint, an
    entry the target will not take — and stopped; the message names the topic and what
    to do."""


class QueueFull(ClientError):
    """The async producer's queue is full and `queue_full="raise"` (or blocking timed out)."""


class ProducerClosed(ClientError):
    """`send` after `close()`."""


class FetchSizeTooSmall(ClientError):
    """A single message is larger than `max_fetch_size`; raise the limit to read it."""


class ConsumerTimeout(ClientError):
    """A consumer-group stream received nothing within `consumer_timeout_ms`."""


class CorruptMessageError(ClientError):
    """An entry of a partition cannot be decoded (bad CRC, format, or compressed value)
    — corrupt data on the broker, not in transit (it was fetched twice). The messages
    before it were delivered. `next_offset` is the way past it (`offset + 4 + size`), or
    None when even its size field is garbage; `consumer.seek(error.next_offset)` skips it."""

    def __init__(self, topic: str, partition: int, offset: int, next_offset: int | None, reason: str) -> None:
        way = (f"seek({next_offset}) to skip it" if next_offset is not None
               else "its size field is unusable, so it cannot be skipped by size")
        super().__init__(f"corrupt entry in {topic}-{partition} at offset {offset}: {reason}; {way}")
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.next_offset = next_offset
        self.reason = reason


def confirm_corrupt(
    suspect: int | None, topic: str, partition: int, corrupt: CorruptEntry,
) -> tuple[int | None, CorruptMessageError | None]:
    """A reader fetches an undecodable entry once more before acting on it (corruption
    in transit goes away). Given the offset already suspected (or None), returns the new
    suspect and, at the second sighting of the same entry, the error to raise or skip."""
    if suspect != corrupt.offset:
        logger.info("%s-%d: %s; fetching it again", topic, partition, corrupt)
        return corrupt.offset, None
    return None, CorruptMessageError(topic, partition, corrupt.offset, corrupt.next_offset, corrupt.reason)
