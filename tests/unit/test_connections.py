"""The connection forms are declared once: the provider info (which Airflow 3.2+ reads)
and the hooks answer the same fields."""

from __future__ import annotations

from airflow_provider_logbus import get_provider_info
from airflow_provider_logbus.connections import FORMS, ICEBERG, LOGBUS, SCHEMA_REGISTRY


def connection_types() -> dict[str, dict]:
    return {c["connection-type"]: c for c in get_provider_info()["connection-types"]}


def test_the_provider_info_carries_each_declared_form():
    types = connection_types()
    assert set(types) == {form.conn_type for form in FORMS}
    assert types["logbus"]["conn-fields"].keys() == {
        "zookeeper", "brokers", "timeout", "security_protocol", "listener", "sasl_mechanism", "ssl_cafile",
        "ssl_ca_pem", "ssl_certfile", "ssl_cert_pem", "ssl_keyfile", "ssl_private_key", "zookeeper_ssl_cafile"}
    behaviour = types["logbus"]["ui-field-behaviour"]
    assert behaviour["hidden-fields"] == []  # login and password are the SASL user's (a secured cluster)
    assert behaviour["relabeling"]["password"] == "SASL password"
    assert types["logbus_iceberg"]["ui-field-behaviour"]["relabeling"] == {"host": "Catalog URI"}


def test_the_hooks_answer_the_provider_infos_form():
    from airflow_provider_logbus.hooks.iceberg import IcebergCatalogHook
    from airflow_provider_logbus.hooks.logbus import LogbusHook
    from airflow_provider_logbus.hooks.registry import SchemaRegistryHook

    types = connection_types()
    for hook, form in ((LogbusHook, LOGBUS), (IcebergCatalogHook, ICEBERG), (SchemaRegistryHook, SCHEMA_REGISTRY)):
        entry = types[hook.conn_type]
        assert entry["hook-class-name"] == f"{hook.__module__}.{hook.__qualname__}"
        assert (entry["hook-name"], entry["connection-type"]) == (hook.hook_name, form.conn_type)
        assert hook.get_ui_field_behaviour() == entry["ui-field-behaviour"]
        widgets = hook.get_connection_form_widgets()
        assert not widgets or widgets.keys() == entry["conn-fields"].keys()  # {} without the FAB stack


def test_every_custom_field_is_a_labelled_optional_json_schema_field():
    for form in FORMS:
        for name, spec in form.fields.items():
            assert spec["label"] and "null" in spec["schema"]["type"], name
