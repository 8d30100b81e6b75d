"""pyiceberg's `Transaction`, computing the table metadata once per staged update.

`Transaction.table_metadata` applies the staged updates to the table's metadata and
deep-copies the result every time anything reads it — about twenty times in one
`add_files` or `append` — and the copy holds every snapshot with its summary. A logbus
commit therefore cost more with every snapshot the table kept (BENCHMARKS.md, "Issue
21": 0.84 s a commit at 120 snapshots, 76% of it these copies). The metadata only
changes when an update is staged or the transaction commits, so it is computed once per
(table metadata, staged updates) and shared, and is the table's own while nothing is
staged: pyiceberg's metadata models are frozen, and nothing in a transaction changes
them in place.
"""

from __future__ import annotations

from pyiceberg.expressions.visitors import manifest_evaluator
from pyiceberg.table import Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import update_table_metadata
from pyiceberg.table.update.snapshot import _OverwriteFiles


class MetadataOnceTransaction(Transaction):
    _computed_for: tuple | None = None
    _computed: TableMetadata | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        if not self._updates:  # nothing staged: pyiceberg's answer is a deep copy of the table's
            return self._table.metadata
        key = (self._table.metadata, self._updates)
        if self._computed_for is None or any(a is not b for a, b in zip(key, self._computed_for)):
            self._computed = update_table_metadata(self._table.metadata, self._updates)
            self._computed_for = key  # holding both keeps their identities unique
        return self._computed


def transaction(table) -> Transaction:
    """`table.transaction()`, with the metadata computed once per staged update."""
    return MetadataOnceTransaction(table)


def replace_files(tx: Transaction, snapshot_properties: dict[str, str]):
    """`tx.update_snapshot(...).overwrite()` — one snapshot deleting the files given to
    `delete_data_file` and adding those given to `append_data_file` — with each manifest
    judged by a visitor of its own.

    pyiceberg's overwrite judges the parent snapshot's manifests in its thread pool with
    one `_ManifestEvalVisitor` per partition spec, and the visitor keeps the manifest it
    is judging in an attribute: judged at once, a manifest can be read with another's
    partition summary, the manifest holding a file to delete is skipped, and the commit
    is refused ("Missing required files to delete"). The year of hourly batches met it
    once in about 1,400 compactions (BENCHMARKS.md, "A year of hourly batches")."""
    from pyiceberg.table.snapshots import Operation

    operation = Operation.OVERWRITE if tx.table_metadata.current_snapshot() is not None else Operation.APPEND
    return _OverwriteJudgingEachManifestAlone(operation=operation, transaction=tx, io=tx._table.io,
                                              snapshot_properties=snapshot_properties)


class _OverwriteJudgingEachManifestAlone(_OverwriteFiles):
    """pyiceberg's overwrite with a fresh manifest visitor per judgement (`replace_files`)."""

    def _build_manifest_evaluator(self, spec_id: int):
        spec, schema, partition_filter = self.spec(spec_id), self.schema(), self.partition_filters[spec_id]
        case_sensitive = self._case_sensitive
        return lambda manifest: manifest_evaluator(spec, schema, partition_filter, case_sensitive)(manifest)
