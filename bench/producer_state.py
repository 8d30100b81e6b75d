"""Broker start-up with producer state (not a test): how long a partition of
idempotent batches takes to open — recovery included — with the producer-state
snapshots (docs/storage.md, "Producer state") and without them (a scan of the whole
log for batch headers).

    .venv/bin/python -m bench.producer_state --gib 1 --batch 50
    .venv/bin/python -m bench.producer_state --gib 1 --batch 1

Builds one partition of `--gib` GiB in 256 MiB segments, the newest half full, written by
20 producer ids in batches of `--batch` messages of 200 bytes, in a scratch directory
(removed afterwards), then opens it, alternating, `--rounds` times each way:

- clean: after a clean close (a snapshot at the log's end: no scan);
- kill -9: recovery of the newest segment, then the scan from the newest roll snapshot;
- no snapshots: the same recovery, then the scan of the whole log.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from broker.common.message import BatchIdentity, encode_batch, now_ms, scan
from broker.server.log.log import Log, LogConfig

SEGMENT = 256 << 20
PRODUCERS = 20


def build(directory: Path, size: int, batch: int, segment_bytes: int = SEGMENT) -> None:
    log = Log(directory, "bench", 0, LogConfig(segment_bytes=segment_bytes))
    value = b"x" * 200
    sequences = [0] * PRODUCERS
    i = 0
    while log.end_offset < size:
        producer = i % PRODUCERS
        identity = BatchIdentity(1000 + producer, 0, sequences[producer], batch)
        sequences[producer] += batch
        data = encode_batch([(None, value, now_ms())] * batch, identity)
        result = scan(data)
        log.append(data, result.count, result.min_timestamp, result.max_timestamp, batch=identity)
        i += 1
    log.close()


def open_time(directory: Path, recover: bool, segment_bytes: int = SEGMENT) -> float:
    start = time.perf_counter()
    log = Log(directory, "bench", 0, LogConfig(segment_bytes=segment_bytes), recover=recover)
    elapsed = time.perf_counter() - start
    assert len(log.producers.entries) == PRODUCERS
    for segment in log.segments:
        segment.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=50, help="messages per producer batch (default 50)")
    parser.add_argument("--segment-mib", type=int, default=SEGMENT >> 20, help="segment size (default 256)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="logbus-bench-producer-state-"))
    try:
        directory = scratch / "bench-0"
        built = time.perf_counter()
        build(directory, int(args.gib * (1 << 30)) + args.segment_mib * (1 << 20) // 2, args.batch,
              args.segment_mib << 20)
        print(f"built {sum(p.stat().st_size for p in directory.glob('*.kafka')) / (1 << 30):.2f} GiB in "
              f"{len(list(directory.glob('*.kafka')))} segments in {time.perf_counter() - built:.0f} s")
        snapshots = {p.name: p.read_bytes() for p in directory.glob("*.producers")}
        end_snapshot = max(snapshots)
        times: dict[str, list[float]] = {"clean (snapshot at the end)": [], "kill -9 (roll snapshots)": [],
                                         "kill -9, no snapshots (full scan)": []}
        for _ in range(args.rounds):
            for name in times:
                for path in directory.glob("*.producers"):
                    path.unlink()
                for file, data in snapshots.items():
                    if name.startswith("clean") or (name.startswith("kill -9 (") and file != end_snapshot):
                        (directory / file).write_bytes(data)
                times[name].append(open_time(directory, recover=not name.startswith("clean"),
                                             segment_bytes=args.segment_mib << 20))
        for name, values in times.items():
            print(f"{name:36} median {statistics.median(values):7.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
