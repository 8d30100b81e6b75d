"""LogbusSparkLoadOperator: runs the load job with spark-submit into a fresh staging directory."""

from __future__ import annotations

import json
import os
import sys
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Iterator, Sequence

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.common.compat.sdk import AirflowException, AirflowNotFoundException, BaseOperator
from airflow.sdk import Connection

from airflow_provider_logbus.cluster import LOAD_LEADER_WAIT_S, SECURITY_ENV, leader_wait_seconds
from airflow_provider_logbus.hooks.logbus import LogbusHook
from airflow_provider_logbus.hooks.registry import SchemaRegistryHook, registry_access
from airflow_provider_logbus.operators.target import DEFAULT_CATALOG_CONN_ID, resolve_target
from airflow_provider_logbus.operators.lineage import ReportsBatchLineage
from airflow_provider_logbus.operators.sparklog import spark_log_file
from airflow_provider_logbus.plan import BatchPlan, Range, ranges_to_json
from airflow_provider_logbus.spark.decode_avro import reader_schema
from airflow_provider_logbus.spark.failure import SPARK_LOG, read_failure
from airflow_provider_logbus.registry_access import REGISTRY_ENV
from airflow_provider_logbus.staged import load_result, write_result
from airflow_provider_logbus.storage import STORAGE_ENV, Storage, join, name_of
from airflow_provider_logbus.targets.base import describe

LOAD_JOB = str(Path(__file__).resolve().parent.parent / "spark" / "load_job.py")
EMBEDDED_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"
# Spark on a local master serves nobody but this machine: driver and block manager on
# loopback, no UI. A user's conf (or a spark_default connection's extras) wins.
LOCAL_CONF = {"spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK, "spark.ui.enabled": "false"}
# What spark-submit's JVM prints at every start and says nothing about the load: Spark's
# launcher always adds `--add-modules=jdk.incubator.vector` (for its vectorized BLAS), and
# the JVM announces an incubator module on stderr, with no option to turn that off.
JVM_NOTICES = frozenset({"WARNING: Using incubator modules: jdk.incubator.vector"})


# the connection a LogbusSparkSubmitHook found, while the stock constructor runs
_FOUND: ContextVar[Connection | None] = ContextVar("logbus_spark_connection", default=None)


class LogbusLoadError(AirflowException):
    """The load job failed; the message is its cause and where Spark's log is."""


def is_local_master(master: str | None) -> bool:
    return bool(master) and master.strip().startswith("local")


def driver_elsewhere(conn: Connection) -> bool:
    """Whether the stock hook would not keep `env_vars` to spark-submit's own process:
    YARN and Kubernetes forward them to the driver (`spark.yarn.appMasterEnv.*`,
    `spark.kubernetes.driverEnv.*`), and a standalone master in cluster mode refuses them."""
    master = (conn.host or "") if conn.conn_type == "spark" else f"{conn.conn_type}://{conn.host or ''}"
    return master.startswith(("yarn", "k8s://")) or conn.extra_dejson.get("deploy-mode") == "cluster"


class LogbusSparkSubmitHook(SparkSubmitHook):
    """SparkSubmitHook whose missing connection means the embedded `local[*]` master
    (the stock hook falls back to YARN). On a local master it binds Spark to loopback
    (`LOCAL_CONF` and `SPARK_LOCAL_IP`, for what `conf` and `env_vars` do not set).
    `env_vars` are for spark-submit's own process only (the load passes this machine's
    interpreter and PATH): where the driver runs elsewhere they are dropped, not sent to
    it — there `conf`'s `spark.pyspark.python` names the interpreter. Public means where
    there are some: the connection through `get_connection`, the binding through the
    constructor's `conf` and `env_vars`; spark-submit's output goes to the task log
    through the stock `_process_spark_submit_log`, less the lines of `JVM_NOTICES`
    (nothing public reaches them).

    The connection is looked up once per hook: in a task, each lookup of a connection
    Airflow does not hold is an execution-API request the api-server logs as a 404, and
    the stock constructor asks `get_connection` again — it gets the one already found
    (`_FOUND`, set while it runs)."""

    def __init__(self, *args: Any, conf: dict[str, Any] | None = None, conn_id: str = "spark_default",
                 env_vars: dict[str, Any] | None = None, **kwargs: Any) -> None:
        conn = self.get_connection(conn_id)
        self.local = conn.conn_type == "spark" and is_local_master(conn.host)  # its host holds the master URL
        if self.local:
            conf = {**LOCAL_CONF, **(conf or {})}
            if env_vars is not None:
                env_vars = {"SPARK_LOCAL_IP": LOOPBACK, **env_vars}
        elif env_vars and driver_elsewhere(conn):
            self.log.info("not sending this machine's %s to a driver elsewhere (%s)", ", ".join(sorted(env_vars)),
                          conn.host)
            env_vars = None
        found = _FOUND.set(conn)
        try:
            super().__init__(*args, conf=conf, conn_id=conn_id, env_vars=env_vars, **kwargs)
        finally:
            _FOUND.reset(found)

    @classmethod
    def get_connection(cls, conn_id: str) -> Connection:
        found = _FOUND.get()
        if found is not None and found.conn_id == conn_id:
            return found
        try:
            return super().get_connection(conn_id)
        except AirflowNotFoundException:
            cls.logger().info("no connection %r: running Spark embedded (%s)", conn_id, EMBEDDED_MASTER)
            return Connection(conn_id=conn_id, conn_type="spark", host=EMBEDDED_MASTER)

    def is_local(self) -> bool:
        return self.local

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        """The stock processing (the task log, the driver's and application's ids), of
        every line but the JVM's start-up notices."""
        super()._process_spark_submit_log(line for line in itr if line.strip() not in JVM_NOTICES)


def python_environment() -> dict[str, str]:
    """Driver and workers run this interpreter (docs/provider.md, "Connections"),
    spark-submit from its venv."""
    bin_dir = str(Path(sys.executable).parent)
    return {
        "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
    }


class LogbusSparkLoadOperator(ReportsBatchLineage, BaseOperator):
    """Loads the ranges from `snapshot_task_id`'s XCom into
    `<warehouse>/<table>/_staging/<batch_id>.<try_number>/`; returns {"staging", "batch_id"}.
    Skips the work when the snapshot says the batch is already committed, and starts no
    Spark application for a batch whose ranges are all empty (it stages the empty batch's
    counts file for the commit to record). Before Spark
    starts, the target creates its table from the declared `schema` or evolves it
    (Iceberg; an incompatible change fails the task naming the field).

    `schema`: Spark DDL or the path of a .json schema file (JSON Schema or an Avro record),
    read here and passed to the job as DDL; without it the job infers one from a sample
    and records it. `schema_subject` (instead of `schema`): a subject of the registry
    whose latest version, read here at each load, is the declared schema — a field a
    producer's new version adds becomes a column at the next load (docs/schemas.md,
    "Loads"). `value_format`: "json", "raw", or "confluent" (registry-framed Avro
    and JSON Schema values, decoded into the declared `schema` with writer schemas from
    the registry of `registry_conn_id` (a `logbus_schema_registry` connection: URL, CA,
    Basic credentials) or `registry_url` (an open registry; it overrides the
    connection's URL); Avro values are resolved to `schema` when it is an Avro file).
    `layout`: "directory" or "iceberg"; by default the target's.
    `max_reject_rate`: fail the load when more than this fraction of a topic's values is
    rejected (1.0, the default: never; the rejects are counted in the batch either way).
    `leader_wait`: seconds the job's reads wait for a partition without a reachable
    leader (a broker restarting, a leadership moving) before the load fails naming the
    partition (`LOAD_LEADER_WAIT_S`, 60): a short outage costs the load that long, not a
    task retry with a new Spark start-up each.

    A failed job raises `LogbusLoadError("<ExceptionType>: <message> (Spark log: <path>)")`
    with the job's own exception (recorded in staging by the job) and spark-submit's output
    kept in the attempt's staging directory. On a local master Spark binds to loopback
    (`LOCAL_CONF`) unless `conf` says otherwise."""

    template_fields: Sequence[str] = ("warehouse", "table", "value_format", "schema", "conf", "target",
                                      "max_reject_rate", "leader_wait", "registry_url", "registry_conn_id",
                                      "schema_subject")
    template_fields_renderers = {"conf": "json"}

    def __init__(self, *, table: str, warehouse: str | None = None, snapshot_task_id: str = "snapshot",
                 value_format: str = "json", schema: str | None = None, conn_id: str = "spark_default",
                 logbus_conn_id: str = LogbusHook.default_conn_name, conf: dict[str, Any] | None = None,
                 fetch_bytes: int = 8 << 20, split_bytes: int = 256 << 20, target: str = "directory",
                 catalog_conn_id: str = DEFAULT_CATALOG_CONN_ID, layout: str | None = None,
                 max_reject_rate: float | str = 1.0, leader_wait: float | str = LOAD_LEADER_WAIT_S,
                 registry_url: str | None = None, registry_conn_id: str | None = None,
                 schema_subject: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if schema and schema_subject:
            raise ValueError(f"give the load's schema or its schema_subject, not both (schema={schema!r}, "
                             f"schema_subject={schema_subject!r})")
        self.schema_subject = schema_subject  # the declared schema is this subject's latest version
        self.layout, self.max_reject_rate, self.leader_wait = layout, max_reject_rate, leader_wait
        self.target, self.catalog_conn_id = target, catalog_conn_id
        self.warehouse, self.table, self.snapshot_task_id = warehouse, table, snapshot_task_id
        self.value_format, self.schema, self.conn_id = value_format, schema, conn_id
        # value_format="confluent"'s schema registry: a URL, or a connection (HTTPS, Basic auth)
        self.registry_url, self.registry_conn_id = registry_url, registry_conn_id
        self.logbus_conn_id, self.conf = logbus_conn_id, conf or {}
        self.fetch_bytes, self.split_bytes = fetch_bytes, split_bytes
        self._hook: SparkSubmitHook | None = None

    def application_args(self, ranges: Sequence[Range], staging: Path, layout: str | None = None,
                         log_file: str | None = None) -> list[str]:
        address = LogbusHook(self.logbus_conn_id).cluster_address()
        args = ["--ranges", ranges_to_json(ranges), "--staging", str(staging), "--format", self.value_format,
                "--fetch-bytes", str(self.fetch_bytes), "--split-bytes", str(self.split_bytes)]
        if address["zookeeper"]:
            args += ["--zookeeper", address["zookeeper"]]
        else:
            args += ["--brokers", address["brokers"]]
        if self.declares:
            args += ["--schema", self.value_schema().to_ddl()]  # a bad schema fails here, before Spark
        args += ["--layout", layout or self.layout or "directory",
                 "--max-reject-rate", str(float(self.max_reject_rate)),
                 "--leader-wait", str(leader_wait_seconds(self.leader_wait))]  # a bad value fails before Spark
        if self.registry_url or self.registry_conn_id:
            args += ["--registry-url", registry_access(self.registry_url, self.registry_conn_id).url]
        avro = reader_schema(self.schema) if self.value_format == "confluent" else None
        if avro:
            args += ["--avro-schema", avro]  # the reader schema Avro values resolve to
        if log_file:
            args += ["--log-file", log_file]
        return args

    @property
    def declares(self) -> bool:
        return bool(self.schema or self.schema_subject)

    def value_schema(self):
        """The declared schema, parsed once per task (a .json schema file is read here,
        on the worker; a subject's latest version is asked for here)."""
        from airflow_provider_logbus.schema import load_schema
        from airflow_provider_logbus.schema.registry import latest_version

        if getattr(self, "_value_schema", None) is None:
            if self.schema_subject:
                version = latest_version(registry_access(self.registry_url, self.registry_conn_id),
                                         self.schema_subject)
                self.log.info("declared schema: %s: %s", version.describe(), version.value_schema.to_ddl())
                self._value_schema = version.value_schema
            else:
                self._value_schema = load_schema(self.schema)
        return self._value_schema

    def execute(self, context) -> dict:
        snapshot = context["ti"].xcom_pull(task_ids=self.snapshot_task_id)
        if not snapshot:
            raise ValueError(f"no ranges in the XCom of task {self.snapshot_task_id!r}")
        plan = BatchPlan.from_dict(snapshot)
        if plan.committed:
            self.log.info("batch %s is already committed; nothing to load", plan.batch_id)
            return {"batch_id": plan.batch_id, "staging": None, "committed": True}
        target = resolve_target(self.target, self.table, warehouse=self.warehouse, catalog_conn_id=self.catalog_conn_id)
        try:
            # create or evolve the table from the declared schema; an incompatible change
            # stops here, before Spark starts and before anything is written
            target.ensure_schema(self.value_schema().to_arrow() if self.declares else None)
            staging = target.prepare_staging(plan.batch_id, context["ti"].try_number)
            layout = self.layout or target.layout
            table = target.dataset()
            storage = target.storage
        finally:
            target.close()
        if plan.empty:
            self.stage_empty_batch(plan, staging, layout, storage)
        else:
            self.run_spark(plan, staging, layout, storage)
        self.batch_lineage = {"address": LogbusHook(self.logbus_conn_id).cluster_address(), "table": table,
                              "batch_id": plan.batch_id, "ranges": plan.ranges}
        return {"batch_id": plan.batch_id, "staging": staging, "committed": False}

    def run_spark(self, plan: BatchPlan, staging: str, layout: str, storage: Storage) -> None:
        """spark-submit the load job into `staging`; a failure raises `LogbusLoadError`
        with the job's own cause."""
        env = self.job_environment(storage)
        conf = {"spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable,
                "spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false", **self.conf}
        # spark-submit's output goes to the task log; the job also writes its own log and
        # the traceback of its failure to this file. The job starts by emptying the
        # staging directory, so the file joins it only when the job failed.
        with spark_log_file(name_of(staging)) as spark_log:
            self._hook = LogbusSparkSubmitHook(
                conf=conf, conn_id=self.conn_id, name=f"logbus-load-{self.table}-{plan.batch_id}",
                application_args=self.application_args(plan.ranges, staging, layout, str(spark_log)), env_vars=env)
            try:
                self._hook.submit(LOAD_JOB)
            except AirflowException as exc:  # spark-submit failed: say why, from what the job recorded
                raise LogbusLoadError(self.failure_message(staging, spark_log, exc, storage)) from exc

    def job_environment(self, storage: Storage) -> dict[str, str]:
        """spark-submit's environment: this interpreter, and the secrets (the cluster's,
        the object store's, the schema registry's), which go here, never on its command
        line (docs/provider.md)."""
        env = python_environment()
        security = LogbusHook(self.logbus_conn_id).security_properties()
        if security:
            env[SECURITY_ENV] = json.dumps(security)
        if storage.properties:
            env[STORAGE_ENV] = json.dumps(storage.properties)
        if self.registry_conn_id:
            registry = SchemaRegistryHook(self.registry_conn_id).client_config()
            env[REGISTRY_ENV] = json.dumps({k: v for k, v in registry.items() if k != "url"})
        return env

    def stage_empty_batch(self, plan: BatchPlan, staging: str, layout: str, storage: Storage) -> None:
        """A batch with nothing in its ranges: the counts file the job would write, without
        starting Spark (40-50 s of a start-up for no row). The commit records the batch as
        any other, so a re-run is a no-op and its ranges (and any loss) are on record."""
        declared = self.value_format in ("json", "confluent") and self.declares
        write_result(staging, load_result(plan.ranges, value_format=self.value_format, layout=layout,
                                          schema=self.value_schema().to_ddl() if declared else None,
                                          schema_source="declared" if declared else None), storage)
        self.log.info("batch %s: every range is empty (%s): nothing to read, no Spark application started; "
                      "staged an empty batch for the commit to record", plan.batch_id, describe(plan.ranges))

    def failure_message(self, staging: str, spark_log: Path, exc: Exception, storage: Storage | None = None) -> str:
        """`<ExceptionType>: <message> (Spark log: <path>)` from what the job recorded in
        staging; the log is kept there, beside the error (both leave with the failed
        attempt's staging when a later attempt commits)."""
        storage = storage or Storage()
        log_path: str = str(spark_log)
        try:
            storage.make_dirs(staging)
            log_path = join(staging, SPARK_LOG)
            storage.write_bytes(log_path, spark_log.read_bytes())
        except OSError as copy_error:
            self.log.warning("could not keep the Spark log in %s: %s", staging, copy_error)
            log_path = "the task log"
        failure = read_failure(staging, storage)
        if failure:
            return f"{failure['type']}: {failure['message']} (Spark log: {log_path})"
        code = str(exc).rsplit("Error code is:", 1)[-1].strip().split(".")[0] if "Error code is:" in str(exc) else "?"
        return (f"spark-submit exited with code {code} before the load job recorded a cause (killed, out of "
                f"memory, or Spark failed to start) (Spark log: {log_path})")

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.on_kill()
