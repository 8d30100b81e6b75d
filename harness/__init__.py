"""Test, demo and benchmark infrastructure that owns real servers: ZooKeeper, a single
server or an ensemble (`harness.zookeeper`); broker processes (`harness.cluster`); a
private PostgreSQL cluster (`harness.postgres`) and a whole Airflow deployment on it
(`harness.airflow`); what they share (`harness.process`).

Not part of the wheel (pyproject's package list is `broker*` and
`airflow_provider_logbus*`; tests/packaging/test_wheel.py checks it); imported by the
tests, the demo and the benchmarks from the repository root."""
