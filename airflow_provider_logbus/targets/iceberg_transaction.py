"""pyiceberg's `Transaction`, computing the table metadata once per staged update.

`Transaction.table_metadata` applies the staged updates to the table's metadata and
deep-copies the result every time anything reads it — about twenty times in one
`add_files` or `append` — and the copy holds every snapshot with its summary. A logbus
commit therefore cost more with every snapshot the table kept (BENCHMARKS.md, "Issue
21": 0.84 s a commit at 120 snapshots, 76% of it these copies). The metadata only
changes when an update is staged or the transaction commits, so it is computed once per
(table metadata, staged updates) and shared: pyiceberg's metadata models are frozen, and
nothing in a transaction changes them in place.
"""

from __future__ import annotations

from pyiceberg.table import Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import update_table_metadata


class MetadataOnceTransaction(Transaction):
    _computed_for: tuple | None = None
    _computed: TableMetadata | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        key = (self._table.metadata, self._updates)
        if self._computed_for is None or any(a is not b for a, b in zip(key, self._computed_for)):
            self._computed = update_table_metadata(self._table.metadata, self._updates)
            self._computed_for = key  # holding both keeps their identities unique
        return self._computed


def transaction(table) -> Transaction:
    """`table.transaction()`, with the metadata computed once per staged update."""
    return MetadataOnceTransaction(table)
