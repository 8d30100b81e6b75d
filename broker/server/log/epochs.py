"""The leader-epoch cache of one partition: which leader epoch began at which offset
(KIP-101). It is how a follower finds where its log diverges from a new leader's
without trusting its own high watermark.

One job: the file `leader-epoch-checkpoint` in the partition directory, text lines
`epoch start_offset`, epochs and starts increasing. A leader appends an entry when it
starts a new epoch (start = its log end); a follower when it appends bytes of a newer
epoch; both drop entries when the log is truncated. Rewritten whole (temp file,
fsync, rename) on every change: changes are as rare as leader changes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

CHECKPOINT = "leader-epoch-checkpoint"
UNDEFINED = -1


class LeaderEpochCache:
    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / CHECKPOINT
        self.entries: list[tuple[int, int]] = self._load()

    def _load(self) -> list[tuple[int, int]]:
        try:
            lines = self.path.read_text().split("\n")
        except FileNotFoundError:
            return []
        entries = []
        for line in filter(None, (line.strip() for line in lines)):
            try:
                epoch, start = (int(v) for v in line.split())
            except ValueError:
                logger.error("%s: ignoring unreadable line %r", self.path, line[:80])
                continue
            if entries and (epoch <= entries[-1][0] or start < entries[-1][1]):
                logger.error("%s: ignoring out-of-order entry %d %d", self.path, epoch, start)
                continue
            entries.append((epoch, start))
        return entries

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else UNDEFINED

    def assign(self, epoch: int, start: int) -> bool:
        """Record that `epoch` begins at `start`. An epoch not newer than the latest is
        ignored; entries starting at or after `start` are superseded (they held no data
        this log kept). True if the file changed."""
        if epoch <= self.latest_epoch:
            return False
        self.entries = [e for e in self.entries if e[1] < start] + [(epoch, start)]
        self._write()
        logger.info("%s: leader epoch %d starts at offset %d", self.path.parent.name, epoch, start)
        return True

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """(largest epoch <= `epoch`, the offset where it ends): the start of the next
        epoch, or `log_end` for the latest. With no epoch <= `epoch`: (UNDEFINED, the
        start of the first epoch), or (UNDEFINED, log_end) for an empty cache."""
        found = UNDEFINED
        for e, start in self.entries:
            if e > epoch:
                return found, start
            found = e
        return found, log_end

    def truncate_from(self, offset: int) -> None:
        """Forget epochs that begin at or after `offset` (the log was cut there)."""
        kept = [e for e in self.entries if e[1] < offset]
        if kept != self.entries:
            self.entries = kept
            self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(CHECKPOINT + ".tmp")
        with open(tmp, "w") as f:
            f.write("".join(f"{e} {s}\n" for e, s in self.entries))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
