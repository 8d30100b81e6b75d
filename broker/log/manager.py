"""All partitions of one broker: finding them on disk at start-up, creating new ones in
the least-loaded log directory, retention, and the clean-shutdown marker that lets the
next start skip recovery."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from broker.config import BrokerConfig
from broker.log.log import Log, LogConfig

logger = logging.getLogger(__name__)

CLEAN_SHUTDOWN = ".clean_shutdown"


def log_config(config: BrokerConfig, topic: str) -> LogConfig:
    """A partition's settings: the broker's, with the topic's retention overrides (so
    that, say, the monitoring topic can outlive size-based retention of busy topics)."""
    return LogConfig(
        segment_bytes=config.log_segment_bytes,
        roll_ms=config.log_roll_ms,
        flush_interval_messages=config.log_flush_interval_messages,
        flush_interval_ms=config.log_flush_interval_ms,
        retention_ms=dict(config.log_retention_ms_per_topic).get(topic, config.log_retention_ms),
        retention_bytes=dict(config.log_retention_bytes_per_topic).get(topic, config.log_retention_bytes),
        max_entry_bytes=config.socket_request_max_bytes,
    )


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """`<topic>-<partition>` (topics may contain '-', so split at the last one)."""
    topic, sep, number = name.rpartition("-")
    if not sep or not topic or not number.isdigit():
        return None
    return topic, int(number)


class LogManager:
    """`_lock` guards `_logs` changes; lookups read the dict without it."""

    def __init__(self, log_dirs: tuple[Path, ...], config: LogConfig | Callable[[str], LogConfig]) -> None:
        self.log_dirs = tuple(Path(d) for d in log_dirs)
        self.config_for: Callable[[str], LogConfig] = config if callable(config) else (lambda topic: config)
        self._logs: dict[tuple[str, int], Log] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        """Open every partition found on disk; recover those of a directory that was not
        shut down cleanly."""
        for directory in self.log_dirs:
            directory.mkdir(parents=True, exist_ok=True)
            marker = directory / CLEAN_SHUTDOWN
            clean = marker.exists()
            for child in sorted(directory.iterdir()):
                parsed = parse_partition_dir(child.name)
                if not child.is_dir() or parsed is None:
                    continue
                if parsed in self._logs:
                    logger.error("partition %s-%d found in two log directories; using %s",
                                 *parsed, self._logs[parsed].directory)
                    continue
                self._logs[parsed] = Log(child, parsed[0], parsed[1], self.config_for(parsed[0]), recover=not clean)
            marker.unlink(missing_ok=True)  # from now on, a crash means recovery
            logger.info("loaded %s (%s shutdown)", directory, "clean" if clean else "unclean")

    def get(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    def get_or_create(self, topic: str, partition: int) -> Log:
        existing = self._logs.get((topic, partition))
        if existing is not None:
            return existing
        with self._lock:
            existing = self._logs.get((topic, partition))
            if existing is None:
                directory = min(self.log_dirs, key=self._partition_count)
                existing = Log(directory / f"{topic}-{partition}", topic, partition, self.config_for(topic))
                self._logs[(topic, partition)] = existing
                logger.info("created partition %s-%d in %s", topic, partition, directory)
            return existing

    def _partition_count(self, directory: Path) -> int:
        return sum(1 for log in self._logs.values() if log.directory.parent == directory)

    def __iter__(self) -> Iterator[Log]:
        return iter(list(self._logs.values()))

    def delete_old_segments(self, now_ms: int | None = None) -> int:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        return sum(len(log.delete_old_segments(now_ms)) for log in self)

    def close(self) -> None:
        """Flush and close every log, then mark each directory as cleanly shut down."""
        for log in self:
            log.close()
        for directory in self.log_dirs:
            (directory / CLEAN_SHUTDOWN).touch()
        logger.info("all logs flushed and closed")
