"""Pieces of the load's failure reporting and of its spark-submit, without Spark: the
root cause inside Spark's wrapped errors, the conf a local master gets, and where the
load's environment goes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import Connection

from airflow_provider_logbus.operators.spark_load import (
    LOCAL_CONF, LogbusSparkLoadOperator, LogbusSparkSubmitHook, driver_elsewhere, python_environment,
)
from airflow_provider_logbus.spark.failure import ERROR_FILE, SPARK_LOG, read_failure, root_cause, write_failure

EXECUTOR_TRACEBACK = """An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/pyspark/worker.py", line 2012, in main
    process()
  File "/work/airflow_provider_logbus/cluster.py", line 171, in leader_connection
    raise ConnectionError(
ConnectionError: leader broker 1 of web_activity-0 is not live; the partition is unavailable until it returns

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:621)
"""


class PythonException(Exception):
    """Named like pyspark's wrapper of an executor's Python error."""


def test_root_cause_of_a_wrapped_executor_error_is_the_python_exception():
    assert root_cause(PythonException(EXECUTOR_TRACEBACK)) == (
        "ConnectionError", "leader broker 1 of web_activity-0 is not live; the partition is unavailable until it returns")


class Py4JJavaError(Exception):
    """Named like py4j's wrapper of a Java exception."""


def test_root_cause_inside_a_java_stage_failure_is_the_first_python_exception():
    text = ("An error occurred while calling o91.parquet.\n: org.apache.spark.SparkException: Job aborted due to stage "
            "failure: Lost task 0.0: org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            '  File "/w/cluster.py", line 150, in leaders\n    raise UnknownTopic(\n'
            "broker.common.errors.UnknownTopic: topic 'web' does not exist\n\n"
            "During handling of the above exception, another exception occurred:\n\n"
            "Traceback (most recent call last):\n  File \"x\", line 1\nRuntimeError: wrapper\n"
            "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:621)\n")
    assert root_cause(Py4JJavaError(text)) == ("UnknownTopic", "topic 'web' does not exist")


def test_root_cause_of_a_driver_error_is_the_error_itself():
    assert root_cause(ValueError("unknown layout 'x'\nmore")) == ("ValueError", "unknown layout 'x'")


def test_failure_file_round_trips(tmp_path):
    path = write_failure(tmp_path / "staging", PythonException(EXECUTOR_TRACEBACK))
    assert Path(path).name == ERROR_FILE
    assert read_failure(tmp_path / "staging")["type"] == "ConnectionError"
    assert read_failure(tmp_path / "nothing") is None


def test_a_job_killed_before_recording_a_cause_says_so_with_the_log(tmp_path):
    log = tmp_path / "spark.log"
    log.write_text("spark-submit output\n")
    operator = LogbusSparkLoadOperator(task_id="load", table="t", warehouse=str(tmp_path))
    message = operator.failure_message(tmp_path / "staging", log, Exception("Cannot execute: spark-submit --master "
                                                                            "local[*] x. Error code is: -9."))
    assert message.startswith("spark-submit exited with code -9 before the load job recorded a cause")
    assert message.endswith(f"(Spark log: {tmp_path / 'staging' / SPARK_LOG})")
    assert (tmp_path / "staging" / SPARK_LOG).read_text() == "spark-submit output\n"


def test_a_recorded_cause_becomes_the_task_error(tmp_path):
    (tmp_path / "staging").mkdir()
    (tmp_path / "staging" / ERROR_FILE).write_text(json.dumps({"type": "RejectRateError", "message": "too many"}))
    log = tmp_path / "spark.log"
    log.write_text("")
    operator = LogbusSparkLoadOperator(task_id="load", table="t", warehouse=str(tmp_path))
    assert operator.failure_message(tmp_path / "staging", log, Exception("Cannot execute")) == (
        f"RejectRateError: too many (Spark log: {tmp_path / 'staging' / SPARK_LOG})")


def test_embedded_spark_binds_loopback_unless_the_conf_says_otherwise(airflow_db):
    hook = LogbusSparkSubmitHook(conf={"spark.ui.enabled": "true"}, conn_id="spark_nonexistent", env_vars={})
    assert hook.is_local()
    assert hook._conf["spark.ui.enabled"] == "true"  # the user's choice
    assert hook._conf["spark.driver.bindAddress"] == hook._conf["spark.driver.host"] == "127.0.0.1"
    assert hook._env_vars["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert set(LOCAL_CONF) <= set(hook._conf)


@pytest.mark.parametrize("conn_id", ["spark_nonexistent", "spark_cluster"])
def test_a_load_looks_its_spark_connection_up_once(airflow_db, monkeypatch, conn_id):
    """In a task every lookup of a connection Airflow does not hold is a request to the
    execution API that the api-server logs as a 404: a load used to look `spark_default`
    up twice (the hook's own check, then the stock hook's)."""
    from airflow.sdk.bases.hook import BaseHook

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", json.dumps({"conn_type": "spark", "host": "spark://master",
                                                                 "port": 7077}))
    asked: list[str] = []
    lookup = BaseHook.get_connection.__func__

    def counting(cls, wanted: str):
        asked.append(wanted)
        return lookup(cls, wanted)

    monkeypatch.setattr(BaseHook, "get_connection", classmethod(counting))
    hook = LogbusSparkSubmitHook(conf={}, conn_id=conn_id, env_vars={})
    assert asked == [conn_id]
    assert hook._connection["master"] == ("local[*]" if conn_id == "spark_nonexistent" else "spark://master:7077")


def test_a_cluster_master_gets_no_loopback_binding(airflow_db, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", json.dumps({"conn_type": "spark", "host": "spark://spark-master",
                                                                 "port": 7077}))
    hook = LogbusSparkSubmitHook(conf={}, conn_id="spark_cluster", env_vars={})
    assert not hook.is_local()
    assert not set(LOCAL_CONF) & set(hook._conf) and "SPARK_LOCAL_IP" not in hook._env_vars


@pytest.mark.parametrize("connection, forwarded", [
    ({"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}, "spark.yarn.appMasterEnv."),
    ({"conn_type": "spark", "host": "yarn"}, "spark.yarn.appMasterEnv."),
    ({"conn_type": "spark", "host": "spark://spark-master", "port": 7077, "extra": {"deploy-mode": "cluster"}}, None),
])
def test_the_load_environment_stays_with_spark_submit_when_the_driver_runs_elsewhere(airflow_db, monkeypatch,
                                                                                  connection, forwarded):
    """The Airflow worker's PATH and interpreter mean nothing on a YARN or Kubernetes
    driver, and the stock hook refuses env_vars in standalone cluster mode."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_REMOTE", json.dumps(connection))
    hook = LogbusSparkSubmitHook(conf={}, conn_id="spark_remote", env_vars=python_environment())
    command = " ".join(hook._build_spark_submit_command("job.py"))  # raised for standalone cluster mode before
    assert "PYSPARK_PYTHON" not in command and "PATH=" not in command
    if forwarded:
        stock = SparkSubmitHook(conf={}, conn_id="spark_remote", env_vars=python_environment())
        assert forwarded + "PATH=" in " ".join(stock._build_spark_submit_command("job.py"))  # what is avoided


def test_a_kubernetes_driver_is_elsewhere_in_either_deploy_mode():
    """(The stock hook needs the Kubernetes provider to be built for a k8s master.)"""
    assert driver_elsewhere(Connection(conn_id="s", conn_type="spark", host="k8s://https://kube-apiserver:6443"))
    assert driver_elsewhere(Connection(conn_id="k", conn_type="k8s", host="kube-apiserver", port=6443))
    assert not driver_elsewhere(Connection(conn_id="s", conn_type="spark", host="spark://spark-master", port=7077))
    assert not driver_elsewhere(Connection(conn_id="s", conn_type="spark", host="local[2]"))


def test_the_load_environment_reaches_spark_submit_with_a_standalone_master_in_client_mode(airflow_db, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", json.dumps({"conn_type": "spark", "host": "spark://spark-master",
                                                                 "port": 7077}))
    hook = LogbusSparkSubmitHook(conf={}, conn_id="spark_cluster", env_vars=python_environment())
    hook._build_spark_submit_command("job.py")
    assert hook._env["PYSPARK_PYTHON"] == sys.executable
