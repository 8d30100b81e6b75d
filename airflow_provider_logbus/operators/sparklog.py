"""The load job's local log file (`SparkLoadOperator.run_spark`): where spark-submit's job
writes its own log and the traceback of its failure, read back when the job fails.

A task process killed with SIGKILL (the OOM killer, a worker lost) never runs its
`finally`, so the file would stay in the temporary directory for good. Each file is
held under an exclusive `flock` while its load runs; the kernel drops the lock with the
process, however it ends, so the next load on the host removes every file no one holds.
A lock, unlike a pid, also holds across pid namespaces that share /tmp."""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

PREFIX = "logbus-spark-"
# a file newer than this is left alone even when unlocked: it may be between its
# creation and its lock
MIN_AGE_S = 60.0


@contextmanager
def spark_log_file(name: str) -> Iterator[Path]:
    """A new log file for one load, locked while the block runs, removed after it;
    files that earlier loads' killed processes left are removed first."""
    remove_abandoned()
    fd, path = tempfile.mkstemp(prefix=f"{PREFIX}{name}-", suffix=".log")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield Path(path)
    finally:
        Path(path).unlink(missing_ok=True)
        os.close(fd)


def remove_abandoned() -> list[Path]:
    """Remove the load logs in the temporary directory that no live process holds;
    the removed paths."""
    now = time.time()
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*.log"):
        try:
            with path.open("rb") as log:
                if now - os.fstat(log.fileno()).st_mtime < MIN_AGE_S:
                    continue
                fcntl.flock(log.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a load holds it
                path.unlink(missing_ok=True)
                removed.append(path)
        except OSError:  # held, gone meanwhile, or another user's
            continue
    return removed
