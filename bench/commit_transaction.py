"""Benchmark (issue 21): an Iceberg batch commit through pyiceberg's own `Transaction`
against `iceberg_transaction.MetadataOnceTransaction` (the table metadata computed once
per staged update, not at every read), as the snapshots a table keeps grow.

    .venv/bin/python -m bench.commit_transaction --batches 168 --checkpoints 24,72,120,168

Two tables, each committed hourly batches of four small files (200 rows each) through
`IcebergTarget.commit` (with its ledger append) and maintained daily as bench.maintenance
does; they take turns, the first one alternating, and differ only in the transaction.
At each checkpoint: the median of each table's last 10 commits. Both tables must end
with the same rows and batch records. Scratch files are removed on the way out, also on
failure (exit status 1).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.iceberg import value_schema  # noqa: E402
from bench.maintenance import commit_hour, maintain_daily  # noqa: E402

PYICEBERG, ONCE = "pyiceberg Transaction", "metadata once"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=168)
    parser.add_argument("--checkpoints", type=lambda s: {int(x) for x in s.split(",")}, default={24, 72, 120, 168})
    args = parser.parse_args(argv)
    from pyiceberg.table import Transaction

    from airflow_provider_logbus.targets import iceberg_transaction
    from airflow_provider_logbus.targets.iceberg import IcebergTarget

    kinds = {PYICEBERG: Transaction, ONCE: iceberg_transaction.MetadataOnceTransaction}
    original = iceberg_transaction.transaction
    work = Path(tempfile.mkdtemp(prefix="logbus-bench-commit-"))
    targets: dict[str, IcebergTarget] = {}
    try:
        for i, name in enumerate(kinds):
            targets[name] = IcebergTarget(f"t{i}", warehouse=str(work / "wh"))
            targets[name].ensure_schema(value_schema())
        times: dict[str, list[float]] = {name: [] for name in kinds}
        print(f"{'batches':>8}  {PYICEBERG:>22}  {ONCE:>14}  ratio", flush=True)
        for h in range(args.batches):
            order = list(kinds) if h % 2 == 0 else list(kinds)[::-1]
            for name in order:
                iceberg_transaction.transaction = kinds[name]  # what every commit of the target opens
                times[name].append(commit_hour(targets[name], h, 4, 200))
                if h and h % 24 == 0:
                    maintain_daily(targets[name], h)
            if h + 1 in args.checkpoints:
                slow, fast = (statistics.median(times[n][-10:]) for n in kinds)
                print(f"{h + 1:>8}  {slow:>20.3f} s  {fast:>12.3f} s  {fast / slow:.2f}", flush=True)
        rows = {n: t.table_or_fail().scan().to_arrow().num_rows for n, t in targets.items()}
        batches = {n: len(t.batches()) for n, t in targets.items()}
        if len(set(rows.values())) != 1 or set(batches.values()) != {args.batches}:
            raise RuntimeError(f"the tables differ: rows {rows}, batch records {batches}")
        print(f"both tables: {rows[ONCE]} rows, {batches[ONCE]} batch records", flush=True)
    finally:
        iceberg_transaction.transaction = original
        for target in targets.values():
            target.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
