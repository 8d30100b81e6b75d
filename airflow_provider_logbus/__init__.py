"""Apache Airflow provider for logbus (see docs/provider.md)."""

__version__ = "0.1.0"


def get_provider_info() -> dict:
    return {
        "package-name": "logbus",
        "name": "logbus",
        "description": "Load logbus topics into a warehouse on Spark, exactly once, with completeness audits.",
        "versions": [__version__],
    }
