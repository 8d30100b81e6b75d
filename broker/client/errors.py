"""Errors raised by the clients themselves (not carried on the wire).

They subclass `LogbusError` so a caller (the `logbus` command, the Airflow hook) can
catch every logbus failure with one clause and show its message as it is.
"""

from __future__ import annotations

from broker.errors import LogbusError


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


class QueueFull(ClientError):
    """The async producer's queue is full and `queue_full="raise"` (or blocking timed out)."""


class ProducerClosed(ClientError):
    """`send` after `close()`."""


class FetchSizeTooSmall(ClientError):
    """A single message is larger than `max_fetch_size`; raise the limit to read it."""


class ConsumerTimeout(ClientError):
    """A consumer-group stream received nothing within `consumer_timeout_ms`."""
