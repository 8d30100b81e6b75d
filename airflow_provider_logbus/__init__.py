"""Apache Airflow provider for logbus (see docs/provider.md)."""

__version__ = "0.1.0"


ICEBERG_UI_FIELD_BEHAVIOUR = {
    "hidden-fields": ["schema", "port", "login", "password"],
    "relabeling": {"host": "Catalog URI"},
    "placeholders": {
        "host": "postgresql+psycopg2://user:pw@db:5432/iceberg, sqlite:////path/catalog.db or https://rest-catalog",
        "extra": '{"warehouse": "file:///data/warehouse"} (+ any pyiceberg catalog property)',
    },
}
ICEBERG_CONN_FIELDS = {
    "warehouse": {"label": "Warehouse location", "description": "file:///data/wh, s3://bucket/wh, ...",
                  "schema": {"type": ["string", "null"]}},
    "type": {"label": "Catalog type", "description": "sql (default) or rest",
             "schema": {"type": ["string", "null"], "default": "sql"}},
}


def get_provider_info() -> dict:
    return {
        "package-name": "logbus",
        "name": "logbus",
        "description": "Load logbus topics into a warehouse on Spark, exactly once, with completeness audits.",
        "versions": [__version__],
        "integrations": [{"integration-name": "logbus", "external-doc-url": "https://example.invalid/logbus",
                          "tags": ["software"]}],
        "hooks": [{"integration-name": "logbus", "python-modules": ["airflow_provider_logbus.hooks.logbus",
                                                                     "airflow_provider_logbus.hooks.iceberg"]}],
        "operators": [{"integration-name": "logbus", "python-modules": [
            "airflow_provider_logbus.operators.snapshot", "airflow_provider_logbus.operators.spark_load",
            "airflow_provider_logbus.operators.commit", "airflow_provider_logbus.operators.audit"]}],
        "sensors": [{"integration-name": "logbus", "python-modules": ["airflow_provider_logbus.sensors.lag"]}],
        "triggers": [{"integration-name": "logbus", "python-modules": ["airflow_provider_logbus.triggers.lag"]}],
        "connection-types": [{
            "hook-class-name": "airflow_provider_logbus.hooks.logbus.LogbusHook",
            "connection-type": "logbus",
            "hook-name": "Logbus",
            "ui-field-behaviour": {
                "hidden-fields": ["login", "password"],
                "relabeling": {"host": "ZooKeeper host", "port": "ZooKeeper port", "schema": "ZooKeeper chroot"},
                "placeholders": {"host": "127.0.0.1", "port": "2181", "schema": "logbus (optional chroot)",
                                 "extra": '{"zookeeper": "zk1:2181/logbus"} or {"brokers": "b1:9092,b2:9092"}'},
            },
            "conn-fields": {
                "zookeeper": {"label": "ZooKeeper connect string",
                              "description": "h1:2181,h2:2181/chroot (overrides host/port)",
                              "schema": {"type": ["string", "null"]}},
                "brokers": {"label": "Static brokers", "description": "h:9092,h:9093 (no group offsets then)",
                            "schema": {"type": ["string", "null"]}},
                "timeout": {"label": "Timeout (s)", "schema": {"type": ["number", "null"], "default": 15}},
            },
        }, {
            "hook-class-name": "airflow_provider_logbus.hooks.iceberg.IcebergCatalogHook",
            "connection-type": "logbus_iceberg",
            "hook-name": "Logbus Iceberg catalog",
            "ui-field-behaviour": ICEBERG_UI_FIELD_BEHAVIOUR,
            "conn-fields": ICEBERG_CONN_FIELDS,
        }],
    }
