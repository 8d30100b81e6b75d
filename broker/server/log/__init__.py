"""The storage engine: partitions as directories of segment files (docs/storage.md)."""
