"""The page's FastAPI app, mounted by the Airflow api-server at `/logbus` (`plugin.py`).

Read-only, and behind Airflow's own authentication and authorisation: every route but
the static assets needs a logged-in user (the api-server's JWT, as a bearer token or
the UI's cookie), and a table's routes need read access to the DAG of the audit task
they name (`requires_access_dag("GET")`, the auth manager's decision); a table lists
only the audits of DAGs the user may read. The routes are
plain functions: FastAPI runs them in its thread pool, so a slow or unreachable cluster
or catalog holds one worker thread for at most `CLUSTER_TIMEOUT_S`, never the
api-server's event loop.

A failure to reach the cluster or the catalog is an answer (503) naming what failed —
`{"error": ..., "failed": "cluster" | "catalog" | "table"}` — never a stack trace.
Answers are cached for `[logbus] ui_cache_seconds` (15) per table and range, so that
many open pages cost one computation.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from airflow_provider_logbus.ui.status import AuditedTable, PageTable, hours, lag, reject_rows

logger = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
CLUSTER_TIMEOUT_S = 5.0
DEFAULT_CACHE_S = 15.0
DEFAULT_HOURS = 48
MAX_HOURS = 24 * 31


class Unreachable(Exception):
    """A part the page depends on failed: `failed` says which (cluster, catalog, table)."""

    def __init__(self, failed: str, message: str) -> None:
        super().__init__(message)
        self.failed = failed


class AnswerCache:
    """Answers by key for `ttl` seconds. Two requests that miss at once both compute
    (a view is bounded work); expired answers are dropped at every store."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._answers: dict[tuple, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple, compute: Callable[[], Any]) -> Any:
        with self._lock:
            hit = self._answers.get(key)
        if hit and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        answer = compute()
        now = time.monotonic()
        with self._lock:
            self._answers = {k: v for k, v in self._answers.items() if now - v[0] < self.ttl}
            self._answers[key] = (now, answer)
        return answer


def open_cluster(table: AuditedTable):
    """The table's cluster, through its logbus connection, with the page's short timeout."""
    from airflow_provider_logbus.cluster import LogbusCluster
    from airflow_provider_logbus.hooks.logbus import LogbusHook

    hook = LogbusHook(table.logbus_conn_id)
    try:
        address = hook.cluster_address()
        return LogbusCluster(address["zookeeper"], address["brokers"], min(address["timeout"], CLUSTER_TIMEOUT_S),
                             client_id="logbus-airflow-ui", security=hook.client_security())
    except Exception as exc:
        raise Unreachable("cluster", f"logbus connection {table.logbus_conn_id!r}: {exc}") from None


def open_table_target(table: AuditedTable):
    from airflow_provider_logbus.operators.target import resolve_target

    try:
        return resolve_target(table.target, table.table, warehouse=table.warehouse,
                              catalog_conn_id=table.catalog_conn_id)
    except Exception as exc:
        raise Unreachable("catalog", f"{table.target} table {table.table!r} (catalog connection "
                                     f"{table.catalog_conn_id!r}): {type(exc).__name__}: {exc}") from None


def with_cluster_and_target(table: AuditedTable, use: Callable[[Any, Any], Any]) -> Any:
    """`use(cluster, target)`, a failure of either named."""
    target = open_table_target(table)
    cluster = open_cluster(table)
    try:
        return use(cluster, target)
    except Unreachable:
        raise
    except (ConnectionError, OSError, TimeoutError) as exc:
        raise Unreachable("cluster", f"logbus cluster of connection {table.logbus_conn_id!r}: "
                                     f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:
        raise Unreachable(failed_part(exc), f"{type(exc).__name__}: {exc}") from None
    finally:
        cluster.close()
        target.close()


def failed_part(exc: BaseException) -> str:
    """Which part an error comes from, by the library that raised it."""
    module = type(exc).__module__
    if module.startswith(("broker.", "kazoo")):
        return "cluster"
    if module.startswith(("sqlalchemy", "pyiceberg", "psycopg")):
        return "catalog"
    return "table"


def _ms(text: str | None, default: datetime) -> int:
    if not text:
        return int(default.timestamp() * 1000)
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise HTTPException(400, f"not an ISO 8601 time: {text!r}") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return int(value.timestamp() * 1000)


def create_app(find_tables: Callable[[Any], list[PageTable]] | None = None) -> FastAPI:
    """The app. `find_tables(user)` lists the tables a user may see (by default: the
    tables of the audit tasks in the DAGs the auth manager lets the user read, one entry
    per table)."""
    find_tables = find_tables or _readable_tables
    app = FastAPI(title="logbus", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    cache_s = cache_seconds()
    reports, lags = AnswerCache(cache_s), AnswerCache(cache_s / 3)
    read_dag = Depends(requires_access_dag("GET"))

    @app.exception_handler(Unreachable)
    def unreachable(_request, exc: Unreachable) -> JSONResponse:
        logger.warning("logbus page: %s unreachable: %s", exc.failed, exc)
        return JSONResponse({"error": str(exc), "failed": exc.failed}, status_code=503)

    def table_of(user, dag_id: str, task_id: str) -> PageTable:
        """The table audit task `dag_id.task_id` checks (any of its audits names it)."""
        for table in find_tables(user):
            if any((audit.dag_id, audit.task_id) == (dag_id, task_id) for audit in table.audits):
                return table
        raise HTTPException(404, f"no logbus audit task {task_id!r} in DAG {dag_id!r}")

    @app.get("/", response_class=HTMLResponse)
    def page(user: GetUserDep) -> str:
        return (STATIC / "page.html").read_text()

    @app.get("/api/tables")
    def tables(user: GetUserDep) -> dict:
        return {"tables": [table.as_json() for table in find_tables(user)]}

    @app.get("/api/tables/{dag_id}/{task_id}/hours", dependencies=[read_dag])
    def table_hours(dag_id: str, task_id: str, user: GetUserDep, start: str | None = Query(None),
                    end: str | None = Query(None)) -> dict:
        table = table_of(user, dag_id, task_id)
        now = datetime.now(timezone.utc)
        end_ms = _ms(end, now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1))
        start_ms = _ms(start, datetime.fromtimestamp(end_ms / 1000, timezone.utc) - timedelta(hours=DEFAULT_HOURS))
        if not 0 < end_ms - start_ms <= MAX_HOURS * 3_600_000:
            raise HTTPException(400, f"the range must be 1 to {MAX_HOURS} hours, start before end")
        return reports.get((table, start_ms, end_ms), lambda: with_cluster_and_target(
            table.primary, lambda cluster, target: hours(table, cluster, target, start_ms, end_ms, _now_ms())))

    @app.get("/api/tables/{dag_id}/{task_id}/lag", dependencies=[read_dag])
    def table_lag(dag_id: str, task_id: str, user: GetUserDep) -> dict:
        table = table_of(user, dag_id, task_id).primary
        partitions = lags.get((table,), lambda: with_cluster_and_target(
            table, lambda cluster, target: lag(table, cluster, target, _now_ms())))
        return {"topic": table.topic, "partitions": partitions}

    @app.get("/api/tables/{dag_id}/{task_id}/rejects/{batch_id}", dependencies=[read_dag])
    def table_rejects(dag_id: str, task_id: str, batch_id: str, user: GetUserDep) -> dict:
        target = open_table_target(table_of(user, dag_id, task_id).primary)
        try:
            return reject_rows(target, batch_id)
        finally:
            target.close()

    @app.get("/api/tables/{dag_id}/{task_id}/snapshots/{snapshot_id}", dependencies=[read_dag])
    def table_snapshot(dag_id: str, task_id: str, snapshot_id: int, user: GetUserDep) -> dict:
        """The Iceberg snapshot that added a file (the page links a file outside every
        batch to it): its time, operation and summary."""
        target = open_table_target(table_of(user, dag_id, task_id).primary)
        try:
            found = target.snapshot(snapshot_id)
        finally:
            target.close()
        if found is None:
            raise HTTPException(404, f"no snapshot {snapshot_id} in table {target.table!r}")
        return found

    return app


def cache_seconds() -> float:
    """`[logbus] ui_cache_seconds` of airflow.cfg (AIRFLOW__LOGBUS__UI_CACHE_SECONDS)."""
    from airflow.configuration import conf

    return conf.getfloat("logbus", "ui_cache_seconds", fallback=DEFAULT_CACHE_S)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _readable_tables(user) -> list[PageTable]:
    from airflow.api_fastapi.app import get_auth_manager

    from airflow_provider_logbus.ui.tables import audited_tables, page_tables

    return page_tables(audited_tables(get_auth_manager().get_authorized_dag_ids(user=user, method="GET")))
