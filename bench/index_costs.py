"""What the entry index costs and saves, in one process without sockets (not a test;
docs/storage.md, "Entry index"): `Log.append` per set as the produce path calls it —
validation, then the append with the set's record count (and, since issue 35, the
index's update) — for plain sets of 1 and 50 200-byte messages and idempotent batches
of 50; then `Log.read_covering` (FETCH version 1's read) at a random batch's start and
at a record inside it, in a partition of up to 2,000 batches of 50 (22 MB). Medians of
`--rounds`; run it in two trees, alternating, to compare them.

    .venv/bin/python -m bench.index_costs --sets 10000 --rounds 3
"""

from __future__ import annotations

import argparse
import inspect
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from broker.common.message import BatchIdentity, encode_batch, encode_message_set, validate_message_set
from broker.server.log.log import Log, LogConfig

VALUE = b"m" * 200


def one_round(directory: Path, kind: str, sets: int) -> float:
    """Microseconds per validated append of `sets` sets of `kind`."""
    log = Log(directory, "bench", 0, LogConfig(flush_interval_messages=1 << 40))
    counts = "records" in inspect.signature(Log.append).parameters  # the code before issue 35 has no records
    plain = {"plain batch 1": encode_message_set([(None, VALUE, 1)]),
             "plain batch 50": encode_message_set([(None, VALUE, 1)] * 50)}.get(kind)
    elapsed, clock = 0.0, time.perf_counter
    for i in range(sets):
        data = plain or encode_batch([(None, VALUE, 1)] * 50, BatchIdentity(7, 0, 50 * i, 50))  # not timed
        start = clock()
        scanned = validate_message_set(data, 1 << 20)
        extra = {"records": scanned.records} if counts else {}
        log.append(data, scanned.count, scanned.min_timestamp, scanned.max_timestamp, **extra)
        elapsed += clock() - start
    log.close()
    shutil.rmtree(directory)
    return elapsed / sets * 1e6


def lookups(directory: Path, sets: int, inside: bool) -> float:
    """Median microseconds of FETCH version 1's read at random batches' starts or records."""
    log = Log(directory, "bench", 0, LogConfig(flush_interval_messages=1 << 40))
    offsets = [log.append(encode_batch([(None, VALUE, 1)] * 50, BatchIdentity(7, 0, 50 * i, 50)), 1, 1, 1).base_offset
               for i in range(sets)]
    log.flush()
    rng, times, clock = random.Random(7), [], time.perf_counter
    for _ in range(sets):
        offset = rng.choice(offsets) + (rng.randrange(1, 50) if inside else 0)
        start = clock()
        log.read_covering(offset, 1 << 16)
        times.append(clock() - start)
    log.close()
    shutil.rmtree(directory)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="logbus-bench-append-"))
    try:
        times: dict[str, list[float]] = {"plain batch 1": [], "plain batch 50": [], "idempotent batch 50": []}
        reads: dict[str, list[float]] = {"at a batch's start": [], "at a record inside": []}
        for r in range(args.rounds):
            for kind in times:
                times[kind].append(one_round(scratch / f"{r}-{kind}", kind, args.sets))
            for kind in reads:
                reads[kind].append(lookups(scratch / f"{r}-{kind}", min(args.sets, 2000), kind != "at a batch's start"))
        rows = [(f"append {kind:22}", "us/set", v) for kind, v in times.items()]
        for label, unit, values in rows + [(f"FETCH v1 read {kind:18}", "us", v) for kind, v in reads.items()]:
            print(f"{label} median {statistics.median(values):8.2f} {unit}  ({', '.join(f'{v:.1f}' for v in values)})")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
