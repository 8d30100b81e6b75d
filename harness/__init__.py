"""Test and demo infrastructure that owns real servers: a private PostgreSQL cluster
(`harness.postgres`) and a whole Airflow deployment on it (`harness.airflow`).

Not part of the wheel (pyproject's package list is `broker*` and
`airflow_provider_logbus*`); imported by the tests from the repository root."""
