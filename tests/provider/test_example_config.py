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
])
def test_a_bad_example_setting_is_refused_naming_the_variable(env, named):
    with pytest.raises(ExampleConfigError, match=named):
        ExampleConfig.from_environment(env)
