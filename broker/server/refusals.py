"""Logging refused requests without a storm: one line per connection and reason.

A client that pipelines thousands of bad requests (a broken producer with acks=0, a
fuzzer) must not turn the broker's log into thousands of identical lines, yet an
operator needs to see each distinct problem and how often it happened. So the first
refusal of each reason on a connection is logged in full, repeats are counted, and the
counts are logged once a minute at most and when the connection closes.
"""

from __future__ import annotations

import logging
import time


class RefusalLog:
    """Rate-limited warnings for one connection, keyed by reason (e.g. api and error)."""

    def __init__(self, logger: logging.Logger, peer: str, interval: float = 60.0) -> None:
        self.logger = logger
        self.peer = peer
        self.interval = interval
        self._suppressed: dict[str, int] = {}
        self._last: dict[str, float] = {}

    def warning(self, reason: str, message: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(reason)
        if last is not None and now - last < self.interval:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        self._last[reason] = now
        repeats = self._suppressed.pop(reason, 0)
        suffix = f" (and {repeats} more like it since the last line)" if repeats else ""
        self.logger.warning("%s: " + message + suffix, self.peer, *args)

    def close(self) -> None:
        """Report what was counted but not logged."""
        for reason, count in sorted(self._suppressed.items()):
            self.logger.warning("%s: %d more refusals of %s were not logged one by one", self.peer, count, reason)
        self._suppressed.clear()
