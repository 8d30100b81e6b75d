"""The examples ship inside the package: the copy command, the checkout's links to them,
and the simulator's fresh events."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_logbus.examples import (DAG_FILES, SIMULATOR, ExampleExistsError, broker_properties,
                                              copy_examples, example_files)
from airflow_provider_logbus.examples.simulate_web_servers import server_events

ROOT = Path(__file__).resolve().parents[2]


def test_checkout_dags_examples_are_the_packaged_files():
    for path in example_files():
        assert (ROOT / "dags" / "examples" / path.name).resolve() == path
    assert (ROOT / "config" / "broker.properties").resolve() == broker_properties()


def test_copy_command_writes_the_dags_and_the_simulator(tmp_path):
    dags = tmp_path / "dags"
    out = subprocess.run([sys.executable, "-m", "airflow_provider_logbus.examples", str(dags),
                          "--broker-properties", str(tmp_path / "etc" / "broker.properties")],
                         capture_output=True, text=True, check=True)
    assert sorted(p.name for p in dags.iterdir()) == sorted((*DAG_FILES, SIMULATOR))
    assert (dags / "logbus_hourly_load.py").read_bytes() == example_files()[0].read_bytes()
    assert "zookeeper.connect" in (tmp_path / "etc" / "broker.properties").read_text()
    assert len(out.stdout.splitlines()) == len(DAG_FILES) + 2  # the DAGs, the simulator, the broker properties


def test_copy_refuses_to_overwrite_a_changed_file_without_force(tmp_path):
    (tmp_path / "logbus_daily_audit.py").write_text("# mine\n")
    with pytest.raises(ExampleExistsError, match="logbus_daily_audit.py"):
        copy_examples(tmp_path)
    assert (tmp_path / "logbus_daily_audit.py").read_text() == "# mine\n"
    assert not (tmp_path / "logbus_hourly_load.py").exists()  # nothing copied
    copy_examples(tmp_path, overwrite=True)
    assert "LogbusAuditOperator" in (tmp_path / "logbus_daily_audit.py").read_text()


def event_ids(seed):
    return [json.loads(value)["event_id"] for _, _, value in server_events(0, 0, 3_600_000, 50, seed)]


def test_simulator_draws_fresh_events_on_every_run():
    first, second = event_ids(None), event_ids(None)
    assert len(set(first)) == 50 and not set(first) & set(second)


def test_simulator_repeats_its_events_only_with_the_same_seed():
    assert event_ids(7) == event_ids(7)
    assert not set(event_ids(7)) & set(event_ids(8))
