"""The example DAGs read one configuration (`airflow_provider_logbus.examples.config`):
parsed with the same environment, the hourly load, the daily audit and the
complete-hours DAG name the same table on the same target; Iceberg unless told
otherwise; a bad setting stops the parse naming the variable. Parsing only: no cluster."""

from __future__ import annotations

import json
import os

import pytest

from airflow_provider_logbus.examples.config import WEB_ACTIVITY_SCHEMA, ExampleConfig, ExampleConfigError
from airflow_provider_logbus.examples.simulate_web_servers import server_events
from airflow_provider_logbus.operators.audit import complete_hours_asset
from airflow_provider_logbus.schema import load_schema

from .conftest import load_dag

DAGS = ("logbus_hourly_load.py", "logbus_daily_audit.py", "logbus_complete_hours.py")
TABLE_ARGS = ("table", "warehouse", "target", "catalog_conn_id")


def example_dags(env: dict[str, str], monkeypatch) -> dict[str, object]:
    """The example DAGs parsed with exactly `env` as their LOGBUS_* settings (restored
    after the test, so that no later test parses with them)."""
    for name in [n for n in os.environ if n.startswith("LOGBUS_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return {file_name: load_dag(file_name, {}) for file_name in DAGS}


def tables_opened(dag) -> set[tuple]:
    """The (table, warehouse, target, catalog connection) of every operator that opens one."""
    return {tuple(getattr(task, a) for a in TABLE_ARGS) for task in dag.tasks if hasattr(task, "target")}


@pytest.mark.parametrize("target", [None, "directory"])
def test_the_three_example_dags_open_one_table_on_one_target(target, tmp_path, monkeypatch):
    env = {"LOGBUS_TABLE": "clicks", "LOGBUS_WAREHOUSE": str(tmp_path), "LOGBUS_CATALOG_CONN_ID": "my_catalog"}
    if target:
        env["LOGBUS_TARGET"] = target
    dags = example_dags(env, monkeypatch)
    expected = {("clicks", str(tmp_path), target or "iceberg", "my_catalog")}
    assert tables_opened(dags["logbus_hourly_load.py"]) == expected
    assert tables_opened(dags["logbus_daily_audit.py"]) == expected  # on Iceberg it audited a directory before
    assert dags["logbus_complete_hours.py"].timetable.asset_condition == complete_hours_asset("clicks")
    if target is None:  # the maintenance DAG keeps the same Iceberg table healthy
        assert tables_opened(load_dag("logbus_table_maintenance.py", {})) == expected
    else:  # a directory table has nothing to maintain: no DAG
        with pytest.raises(AttributeError):
            load_dag("logbus_table_maintenance.py", {})


def test_the_examples_default_to_iceberg_with_the_simulators_schema():
    config = ExampleConfig.from_environment({})
    assert (config.target, config.table, config.topic) == ("iceberg", "web_activity", "web_activity")
    assert config.value_schema == WEB_ACTIVITY_SCHEMA
    assert ExampleConfig.from_environment({"LOGBUS_TARGET": "directory", "LOGBUS_VALUE_SCHEMA": "infer"}
                                          ).value_schema is None


def test_the_simulators_events_are_what_the_default_schema_declares():
    fields = {f.name for f in load_schema(WEB_ACTIVITY_SCHEMA).to_arrow()}
    for _, _, value in server_events(0, 0, 3_600_000, 20):
        assert set(json.loads(value)) == fields


@pytest.mark.parametrize("env, named", [
    ({"LOGBUS_TARGET": "parquet"}, "LOGBUS_TARGET='parquet': use one of directory, iceberg"),
    ({"LOGBUS_VALUE_SCHEMA": "infer"}, "LOGBUS_VALUE_SCHEMA=infer needs LOGBUS_TARGET=directory"),
    ({"LOGBUS_LEADER_WAIT_SECONDS": "a minute"}, "LOGBUS_LEADER_WAIT_SECONDS='a minute' is not a number"),
    ({"LOGBUS_RETRY_DELAY_SECONDS": "-5"}, "LOGBUS_RETRY_DELAY_SECONDS='-5' must not be negative"),
    ({"LOGBUS_ON_DATA_LOSS": "ignore"}, "LOGBUS_ON_DATA_LOSS='ignore': use fail or skip"),
    ({"LOGBUS_VALUE_FORMAT": "avro"}, "LOGBUS_VALUE_FORMAT='avro': use one of json, confluent"),
    ({"LOGBUS_SCHEMA_SUBJECT": "clicks-value", "LOGBUS_VALUE_SCHEMA": "a int"},
     "LOGBUS_SCHEMA_SUBJECT='clicks-value' and LOGBUS_VALUE_SCHEMA are both set"),
])
def test_a_bad_example_setting_is_refused_naming_the_variable(env, named):
    with pytest.raises(ExampleConfigError, match=named):
        ExampleConfig.from_environment(env)


def test_a_schema_subject_adds_a_check_before_the_snapshot_and_reaches_the_registry(tmp_path, monkeypatch):
    """The registry-framed load of the hourly DAG (docs/schemas.md): the subject's check
    runs before the snapshot and Spark; a URL alone needs no connection; without a
    subject or framed values the DAG is as before, with no registry to reach."""
    env = {"LOGBUS_WAREHOUSE": str(tmp_path), "LOGBUS_VALUE_FORMAT": "confluent",
           "LOGBUS_SCHEMA_SUBJECT": "clicks-value", "LOGBUS_REGISTRY_URL": "http://registry:8081"}
    dag = example_dags(env, monkeypatch)["logbus_hourly_load.py"]
    load, check = dag.get_task("load"), dag.get_task("check_schema")
    assert (load.value_format, load.schema, load.schema_subject) == ("confluent", None, "clicks-value")
    assert (load.registry_url, load.registry_conn_id) == ("http://registry:8081", None)
    assert (check.schema_subject, check.registry_url, check.registry_conn_id) == ("clicks-value",
                                                                                  "http://registry:8081", None)
    assert dag.get_task("snapshot").upstream_task_ids == {"check_schema"}
    assert check.upstream_task_ids == {"wait_for_data"}
    assert tables_opened(dag) == {("web_activity", str(tmp_path), "iceberg", "logbus_iceberg_default")}

    framed = example_dags({"LOGBUS_VALUE_FORMAT": "confluent"}, monkeypatch)["logbus_hourly_load.py"]
    load = framed.get_task("load")
    assert (load.schema, load.registry_url, load.registry_conn_id) == (WEB_ACTIVITY_SCHEMA, None,
                                                                       "logbus_schema_registry_default")
    assert "check_schema" not in framed.task_ids

    plain = example_dags({}, monkeypatch)["logbus_hourly_load.py"].get_task("load")
    assert (plain.value_format, plain.registry_url, plain.registry_conn_id, plain.schema_subject) == (
        "json", None, None, None)
