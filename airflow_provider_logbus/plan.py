"""A batch's plan: which byte ranges of which partitions one run loads
(docs/provider.md, "The ranges of a batch").

Typed records travel through the provider; they are turned into dicts only at the edges
(XCom, batch records, the Spark job's arguments).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Iterable


def batch_id_for(start: datetime, end: datetime) -> str:
    """`20240101T000000_20240101T010000` from a data interval (UTC)."""

    def fmt(d: datetime) -> str:
        if d.tzinfo is not None:
            d = d.astimezone(timezone.utc)
        return d.strftime("%Y%m%dT%H%M%S")

    return f"{fmt(start)}_{fmt(end)}"


@dataclass(frozen=True)
class Range:
    """Bytes [start, end) of one partition loaded by a batch. `lost_start`/`lost_end`
    name bytes that retention deleted before they could be loaded (on_data_loss="skip"):
    the range then starts at `lost_end` on purpose."""

    topic: str
    partition: int
    start: int
    end: int
    lost_start: int | None = None
    lost_end: int | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "Range":
        lost_start, lost_end = d.get("lost_start"), d.get("lost_end")
        return cls(str(d["topic"]), int(d["partition"]), int(d["start"]), int(d["end"]),
                   None if lost_start is None else int(lost_start), None if lost_end is None else int(lost_end))

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.lost_start is None:
            d.pop("lost_start")
            d.pop("lost_end")
        return d

    @property
    def expected_start(self) -> int:
        """Where the table's committed end must stand for this range to follow it without
        a hole or an overlap: the start, or the start of the bytes recorded as lost."""
        return self.start if self.lost_start is None else self.lost_start

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition


def ranges_to_json(ranges: Iterable[Range]) -> str:
    """The JSON list the load job's `--ranges`, the data source's `ranges` option and an
    Iceberg snapshot's `logbus.ranges` hold."""
    return json.dumps([r.to_dict() for r in ranges])


def ranges_from_json(text: str) -> list[Range]:
    return [Range.from_dict(d) for d in json.loads(text)]


def rebase(ranges: list[Range], committed: dict[tuple[str, int], int]) -> list[Range]:
    """The ranges moved forward so that each starts at the table's committed end.

    This is how a batch that lost the commit race re-plans without reading the broker
    again: its staged data holds every message of [start, end), so the rows of
    [committed end, end) are a subset of it. A range the winner covered entirely becomes
    empty at the committed end. A committed end *behind* a range's start cannot be
    rebased (the rows between were never read) and raises `ValueError`.
    """
    out = []
    for r in ranges:
        end_now = committed.get(r.key)
        if end_now is None or end_now == r.expected_start:
            out.append(r)
        elif end_now < r.expected_start:
            raise ValueError(
                f"{r.topic}-{r.partition}: the table's committed end {end_now} is behind this batch's start "
                f"{r.expected_start}; bytes [{end_now}, {r.expected_start}) were never read by it")
        elif end_now < r.start:  # inside bytes already recorded as lost by this batch
            out.append(Range(r.topic, r.partition, r.start, r.end, lost_start=end_now, lost_end=r.start))
        else:
            out.append(Range(r.topic, r.partition, end_now, max(r.end, end_now)))
    return out


@dataclass(frozen=True)
class BatchPlan:
    """What the offset snapshot fixed for one run; `committed` when the batch was already
    in the table (a cleared or re-run run), then `ranges` are the recorded ones."""

    batch_id: str
    table: str
    topic: str
    interval_start: str
    interval_end: str
    ranges: tuple[Range, ...] = field(default_factory=tuple)
    committed: bool = False

    @classmethod
    def from_dict(cls, d: dict) -> "BatchPlan":
        return cls(batch_id=str(d["batch_id"]), table=str(d["table"]), topic=str(d["topic"]),
                   interval_start=str(d["interval_start"]), interval_end=str(d["interval_end"]),
                   ranges=tuple(Range.from_dict(r) for r in d.get("ranges", ())),
                   committed=bool(d.get("committed", False)))

    def to_dict(self) -> dict:
        return {"batch_id": self.batch_id, "table": self.table, "topic": self.topic,
                "interval_start": self.interval_start, "interval_end": self.interval_end,
                "ranges": [r.to_dict() for r in self.ranges], "committed": self.committed}

    def with_ranges(self, ranges: list[Range]) -> "BatchPlan":
        return replace(self, ranges=tuple(ranges))

    @property
    def empty(self) -> bool:
        """Nothing to read: every range is empty (a backfill of hours another run already
        loaded). Its batch is still committed — with any loss it records — so that a
        re-run is a no-op and the audit sees the ranges follow each other."""
        return all(r.end == r.start for r in self.ranges)
