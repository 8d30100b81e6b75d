"""Apache Airflow provider for logbus (see docs/provider.md)."""

__version__ = "0.1.0"


def get_provider_info() -> dict:
    from airflow_provider_logbus.connections import FORMS

    return {
        "package-name": "logbus",
        "name": "logbus",
        "description": "Load logbus topics into a warehouse on Spark, exactly once, with completeness audits.",
        "versions": [__version__],
        "integrations": [{"integration-name": "logbus", "external-doc-url": "https://example.invalid/logbus",
                          "tags": ["software"]}],
        "hooks": [{"integration-name": "logbus", "python-modules": ["airflow_provider_logbus.hooks.logbus",
                                                                     "airflow_provider_logbus.hooks.iceberg",
                                                                     "airflow_provider_logbus.hooks.registry"]}],
        "operators": [{"integration-name": "logbus", "python-modules": [
            "airflow_provider_logbus.operators.snapshot", "airflow_provider_logbus.operators.spark_load",
            "airflow_provider_logbus.operators.commit", "airflow_provider_logbus.operators.audit",
            "airflow_provider_logbus.operators.maintenance", "airflow_provider_logbus.operators.schema_check"]}],
        "sensors": [{"integration-name": "logbus", "python-modules": ["airflow_provider_logbus.sensors.lag"]}],
        "triggers": [{"integration-name": "logbus", "python-modules": ["airflow_provider_logbus.triggers.lag"]}],
        "connection-types": [form.provider_info() for form in FORMS],
    }
