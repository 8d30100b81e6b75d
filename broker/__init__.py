"""logbus broker: a log-structured, partitioned message broker after the Kafka paper."""

__version__ = "0.1.0"
