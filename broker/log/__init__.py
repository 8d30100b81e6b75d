"""The storage engine: partitions as directories of segment files (DESIGN §3)."""
