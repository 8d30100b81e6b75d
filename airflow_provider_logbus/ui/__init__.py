"""The logbus page in the Airflow UI: completeness by hour and tier, batches and their
offsets, lag per partition (docs/provider.md, "The Logbus page")."""
