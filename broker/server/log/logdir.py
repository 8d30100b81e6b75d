"""Health of one log directory: online, or offline after a write it could not take.

A full disk (or a failing one) must not turn into a storm: the first failed write
takes the whole directory offline with one log line, every later append to any of its
partitions is refused at once with `StorageError` (13) — no write attempted, nothing
logged here — and a probe thread tries the directory every `probe_interval` seconds
until it can take a write again, then puts it back online with one log line. Nobody
has to restart the broker when space returns.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path

from broker.common.errors import StorageError

logger = logging.getLogger(__name__)

# errors that say the directory (not one request) cannot take writes
OFFLINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})
PROBE_FILE = ".logbus-probe"
PROBE_BYTES = 4096


class LogDir:
    """`_lock` guards the online/offline transition and the probe thread's start; readers
    of `online` take no lock (a bool)."""

    def __init__(self, path: Path, probe_interval_ms: int = 1000, min_free_bytes: int = 1 << 20) -> None:
        self.path = Path(path)
        self.probe_interval = probe_interval_ms / 1000
        self.min_free_bytes = min_free_bytes
        self.online = True
        self.reason = ""
        self.offline_since = 0.0
        self.refused = 0  # appends refused while offline (reported when it comes back)
        self._lock = threading.Lock()
        self._probe: threading.Thread | None = None
        self._stopped = threading.Event()

    def check_writable(self, partition: str) -> None:
        """Raise StorageError when the directory is offline (the append path's first check)."""
        if not self.online:
            self.refused += 1
            raise StorageError(
                f"log directory {self.path} of partition {partition} is offline ({self.reason}); "
                "appends resume by themselves when it can take writes again"
            )

    def failed(self, exc: OSError, partition: str, what: str) -> StorageError:
        """A write to this directory failed: take it offline if the error is about the
        directory, and return the error the producer gets."""
        reason = f"{what} failed: {exc.strerror or exc}"
        if getattr(exc, "errno", None) in OFFLINE_ERRNOS:
            self.go_offline(f"{reason} (errno {errno.errorcode.get(exc.errno, exc.errno)})")
        else:
            logger.error("%s: %s", partition, reason)
        return StorageError(f"{partition}: {reason}; nothing of this request was appended")

    def go_offline(self, reason: str) -> None:
        with self._lock:
            if not self.online:
                return
            self.online = False
            self.reason = reason
            self.offline_since = time.monotonic()
            self.refused = 0
            logger.error(
                "log directory %s is OFFLINE: %s; appends to its partitions are refused with StorageError (13) "
                "until a probe every %g s finds it writable with %d bytes free", self.path, reason,
                self.probe_interval, self.min_free_bytes,
            )
            if self._probe is None:  # the probe clears `_probe` under the lock as it puts the directory online
                self._probe = threading.Thread(target=self._probe_loop, name=f"probe-{self.path.name}", daemon=True)
                self._probe.start()

    def _go_online(self) -> None:
        with self._lock:
            self.online = True
            self._probe = None
            logger.warning("log directory %s is ONLINE again after %.1f s; %d appends were refused meanwhile",
                           self.path, time.monotonic() - self.offline_since, self.refused)

    def probe(self) -> bool:
        """Can the directory take writes again? Enough free space, and a small file can
        be written, fsynced and removed."""
        try:
            stats = os.statvfs(self.path)
            if stats.f_bavail * stats.f_frsize < self.min_free_bytes:
                return False
            path = self.path / PROBE_FILE
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, b"\0" * PROBE_BYTES)
                os.fsync(fd)
            finally:
                os.close(fd)
                path.unlink(missing_ok=True)
            return True
        except OSError:
            return False

    def _probe_loop(self) -> None:
        while not self._stopped.wait(self.probe_interval):
            if self.probe():
                self._go_online()
                return

    def stop(self) -> None:
        self._stopped.set()
