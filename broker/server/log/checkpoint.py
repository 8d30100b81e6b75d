"""The high-watermark checkpoint of one log directory: `replication-offset-checkpoint`,
text lines `topic partition hw`, one per replicated partition in the directory.

Written periodically and at a clean shutdown, so a broker that restarts and becomes
leader starts from a high watermark it knew rather than from zero (a high watermark
never moves backwards on a leader). Rewritten whole: temp file, fsync, rename.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

HW_CHECKPOINT = "replication-offset-checkpoint"


def read_hw_checkpoint(directory: Path) -> dict[tuple[str, int], int]:
    try:
        text = (Path(directory) / HW_CHECKPOINT).read_text()
    except FileNotFoundError:
        return {}
    marks = {}
    for line in filter(None, (line.strip() for line in text.split("\n"))):
        try:
            topic, partition, hw = line.rsplit(" ", 2)
            marks[(topic, int(partition))] = int(hw)
        except ValueError:
            logger.error("%s: ignoring unreadable line %r", directory, line[:200])
    return marks


def write_hw_checkpoint(directory: Path, marks: dict[tuple[str, int], int]) -> None:
    path = Path(directory) / HW_CHECKPOINT
    tmp = path.with_name(HW_CHECKPOINT + ".tmp")
    with open(tmp, "w") as f:
        f.write("".join(f"{t} {p} {hw}\n" for (t, p), hw in sorted(marks.items())))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
