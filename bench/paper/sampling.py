"""Throughput sampled over a run: a point every `every` messages (10 MB of 200-byte
messages by default), the way the paper's Figures 4 and 5 draw throughput against
the data sent; and a progress line on stderr."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field


@dataclass
class Sampler:
    label: str
    total: int
    every: int
    message_bytes: int = 200
    quiet: bool = False
    done: int = 0
    started: float | None = None
    ended: float | None = None
    points: list[tuple[int, float]] = field(default_factory=list)  # (messages done, seconds since start)
    notes: list[str] = field(default_factory=list)
    pending: int = 0  # counted by `add`, not yet sampled

    def start(self) -> None:
        self.done = 0
        self.points = [(0, 0.0)]
        self.started = time.perf_counter()

    def chunks(self, messages: int):
        """Sizes of the loops between two samples."""
        full, rest = divmod(messages, self.every)
        for _ in range(full):
            yield self.every
        if rest:
            yield rest

    def tick(self, messages: int) -> None:
        if messages <= 0:
            return
        self.done += messages
        elapsed = time.perf_counter() - self.started
        self.points.append((self.done, elapsed))
        if not self.quiet:
            rate = self.done / elapsed if elapsed > 0 else 0.0
            sys.stderr.write(f"\r  {self.label}: {self.done:>10,}/{self.total:,} messages, {elapsed:6.1f}s, "
                             f"{rate:>10,.0f} msg/s   ")
            sys.stderr.flush()

    def add(self, messages: int) -> None:
        """Count `messages` done, one sample per `every` of them (the rest waits for
        more, or for `finish`)."""
        self.pending += messages
        while self.pending >= self.every:
            self.tick(self.every)
            self.pending -= self.every

    def finish(self) -> None:
        self.tick(self.pending)
        self.pending = 0
        self.ended = time.perf_counter()
        if not self.quiet:
            sys.stderr.write("\n")

    def note(self, text: str) -> None:
        self.notes.append(text)

    @property
    def seconds(self) -> float:
        return (self.ended or time.perf_counter()) - self.started

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def series(self) -> list[tuple[float, float]]:
        """(MB sent so far, msg/s over the last interval), one point per sample."""
        out = []
        for (n0, t0), (n1, t1) in zip(self.points, self.points[1:]):
            if t1 > t0 and n1 > n0:
                out.append((n1 * self.message_bytes / 1e6, (n1 - n0) / (t1 - t0)))
        return out
