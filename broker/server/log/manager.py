"""All partitions of one broker: finding them on disk at start-up, creating new ones in
the least-loaded log directory, removing those of deleted topics, retention, and the
clean-shutdown marker that lets the next start skip recovery.

Each partition directory holds its topic's id (`topic.id`, KIP-516's
partition.metadata): the incarnation of the name it belongs to, so that a broker that
was down while its topic was deleted, and perhaps created again, removes the old data
instead of serving it (docs/storage.md, "Deleted topics"). A removed directory is
first renamed to `<name>.<random>-delete` (one atomic step, which `load` finishes
after a crash), then deleted in the background.

Start-up cost per partition is a directory listing, a stat and a small sidecar read per
segment, plus recovery's scan of the newest segment after an unclean stop; no segment
file is opened until it is read or written, and the `FileCache` bounds how many are
open at once, so a broker with more partitions than open files still starts."""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

from broker.server.log.checkpoint import HW_CHECKPOINT, read_hw_checkpoint, write_hw_checkpoint
from broker.server.log.files import FileCache
from broker.server.log.log import Log, LogConfig
from broker.server.log.logdir import LogDir

logger = logging.getLogger(__name__)

CLEAN_SHUTDOWN = ".clean_shutdown"
TOPIC_ID = "topic.id"
REMOVED = "-delete"  # the suffix of a partition directory being removed


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """`<topic>-<partition>` (topics may contain '-', so split at the last one)."""
    topic, sep, number = name.rpartition("-")
    if not sep or not topic or not number.isdigit():
        return None
    return topic, int(number)


def topic_id_of(log: Log) -> str | None:
    """The topic id a partition directory was created for; None before ids."""
    try:
        return (log.directory / TOPIC_ID).read_text().strip() or None
    except FileNotFoundError:
        return None


class LogManager:
    """`_lock` guards `_logs` and `_counts` changes; lookups read the dict without it."""

    def __init__(self, log_dirs: tuple[Path, ...], config: LogConfig | Callable[[str], LogConfig]) -> None:
        self.log_dirs = tuple(Path(d) for d in log_dirs)
        self.config_for: Callable[[str], LogConfig] = config if callable(config) else (lambda topic: config)
        broker_wide = self.config_for("")
        self.files = FileCache(broker_wide.open_files_max)
        self.dirs = {
            d: LogDir(d, broker_wide.dir_probe_interval_ms, broker_wide.dir_min_free_bytes) for d in self.log_dirs
        }
        self._logs: dict[tuple[str, int], Log] = {}
        self._counts = {d: 0 for d in self.log_dirs}  # partitions per log directory
        self.checkpointed_hw: dict[tuple[str, int], int] = {}  # read at load (replicated partitions)
        self.topic_id_of: Callable[[str], str | None] = lambda topic: None  # the cluster's current incarnation
        self._lock = threading.Lock()

    def _open_log(self, directory: Path, topic: str, partition: int, recover: bool = False) -> Log:
        log = Log(directory / f"{topic}-{partition}", topic, partition, self.config_for(topic), recover,
                  self.files, self.dirs[directory])
        self._logs[(topic, partition)] = log
        self._counts[directory] += 1
        return log

    def load(self) -> None:
        """Open every partition found on disk; recover those of a directory that was not
        shut down cleanly."""
        for directory in self.log_dirs:
            directory.mkdir(parents=True, exist_ok=True)
            marker = directory / CLEAN_SHUTDOWN
            clean = marker.exists()
            self.checkpointed_hw.update(read_hw_checkpoint(directory))
            for child in sorted(directory.iterdir()):
                if child.name.endswith(REMOVED) and child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)  # a removal a crash interrupted
                    continue
                parsed = parse_partition_dir(child.name)
                if not child.is_dir() or parsed is None:
                    continue
                if parsed in self._logs:
                    logger.error("partition %s-%d found in two log directories; using %s",
                                 *parsed, self._logs[parsed].directory)
                    continue
                self._open_log(directory, parsed[0], parsed[1], recover=not clean)
            marker.unlink(missing_ok=True)  # from now on, a crash means recovery
            logger.info("loaded %d partitions from %s (%s shutdown)", self._counts[directory], directory,
                        "clean" if clean else "unclean")

    def get(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    def get_or_create(self, topic: str, partition: int) -> Log:
        existing = self._logs.get((topic, partition))
        if existing is not None:
            return existing
        with self._lock:
            existing = self._logs.get((topic, partition))
            if existing is None:
                online = [d for d in self.log_dirs if self.dirs[d].online] or list(self.log_dirs)
                directory = min(online, key=self._counts.__getitem__)
                existing = self._open_log(directory, topic, partition)
                if (topic_id := self.topic_id_of(topic)) is not None:
                    (existing.directory / TOPIC_ID).write_text(topic_id)
                logger.info("created partition %s-%d in %s", topic, partition, directory)
            return existing

    def adopt(self, topic: str, topic_id: str | None) -> list[Log]:
        """The topic is now the incarnation `topic_id`: remove the logs of any other one
        (a deletion this broker missed); the logs removed. A topic from before ids
        (None) keeps its logs, and so does a directory without `topic.id` — written by
        a broker from before ids, as during a rolling upgrade — which takes the id (as
        Kafka writes a missing partition.metadata): removed, a one-replica partition's
        data would be lost."""
        if topic_id is None:
            return []
        replaced = []
        with self._lock:  # `get_or_create` writes a new log's id under it: a read here never sees it half-written
            for log in [log for log in self if log.topic == topic]:
                found = topic_id_of(log)
                if found is None:
                    (log.directory / TOPIC_ID).write_text(topic_id)
                elif found != topic_id:
                    replaced.append(log)
        return self._remove(replaced, f"topic id {topic_id} replaced it")

    def remove_topic(self, topic: str) -> list[Log]:
        """The topic was deleted: remove its logs; the logs removed."""
        return self._remove([log for log in self if log.topic == topic], "topic deleted")

    def remove_strays(self, topics: set[str], deleted: set[str]) -> list[Log]:
        """At start, once the cluster's topics are known: remove the logs of topics deleted
        while this broker was down — those whose topic id is one of the `deleted` ids.
        Any other log of a topic that does not exist is left on disk, unserved: nothing
        tells it from a ZooKeeper that lost its data, or the wrong one."""
        strays = [log for log in self if log.topic not in topics]
        gone = [log for log in strays if topic_id_of(log) in deleted]
        for log in strays:
            if log not in gone:
                logger.warning("%s: its topic does not exist, and no deletion of its topic id %s is recorded; "
                               "left on disk, not served", log.name, topic_id_of(log))
        return self._remove(gone, "topic deleted while down")

    def _remove(self, logs: list[Log], why: str) -> list[Log]:
        removed = []
        for log in logs:
            with self._lock:
                key = (log.topic, log.partition)
                if self._logs.get(key) is not log:
                    continue
                del self._logs[key]
                self._counts[log.directory.parent] -= 1
                self.checkpointed_hw.pop(key, None)
            log.close()
            trash = log.directory.with_name(f"{log.directory.name}.{uuid.uuid4().hex[:8]}{REMOVED}")
            try:
                log.directory.rename(trash)
            except OSError as exc:
                logger.error("%s: cannot remove %s (%s): %s", log.name, log.directory, why, exc)
                continue
            threading.Thread(target=shutil.rmtree, args=(trash,), kwargs={"ignore_errors": True},
                             name="logbus-remove-log", daemon=True).start()
            logger.info("%s: removed %s (%s)", log.name, log.directory, why)
            removed.append(log)
        return removed

    def __iter__(self) -> Iterator[Log]:
        return iter(list(self._logs.values()))

    def delete_old_segments(self, now_ms: int | None = None) -> int:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        return sum(len(log.delete_old_segments(now_ms)) for log in self)

    def checkpoint_high_watermarks(self) -> None:
        """Write each log directory's high-watermark checkpoint (replicated partitions:
        those whose log has a high watermark)."""
        for directory in self.log_dirs:
            marks = {(log.topic, log.partition): log.high_watermark for log in self
                     if log.high_watermark is not None and log.directory.parent == directory}
            if marks or (directory / HW_CHECKPOINT).exists():
                try:
                    write_hw_checkpoint(directory, marks)
                except OSError as exc:
                    logger.error("cannot write the high-watermark checkpoint of %s: %s", directory, exc)

    def close(self) -> None:
        """Flush and close every log, then mark each directory whose logs all closed
        cleanly as cleanly shut down (the others are recovered at the next start)."""
        self.checkpoint_high_watermarks()
        unclean = set()
        for log in self:
            if not log.close():
                unclean.add(log.directory.parent)
        for directory, log_dir in self.dirs.items():
            log_dir.stop()
            if directory in unclean or not log_dir.online:
                logger.warning("log directory %s was not shut down cleanly; it is recovered at the next start", directory)
                continue
            try:
                (directory / CLEAN_SHUTDOWN).touch()
            except OSError as exc:
                logger.error("cannot mark %s cleanly shut down: %s", directory, exc)
        logger.info("all logs flushed and closed")
