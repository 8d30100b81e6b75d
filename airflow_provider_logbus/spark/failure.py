"""Why a load job failed, in a form the Airflow task can raise.

A failure inside a Spark task reaches the driver wrapped (a `PythonException` or a
`Py4JJavaError` whose text holds the executor's Python traceback after a Java stack),
and spark-submit's exit code says only that it failed. The job records its cause —
the innermost Python exception's type and message — in `<staging>/_logbus_error.json`;
`LogbusSparkLoadOperator` reads it and raises it with the path of the Spark log.
No Airflow or Spark import here: the job imports it under spark-submit. Staging may be
on an object store: the file goes through `Storage`.
"""

from __future__ import annotations

import re
from pathlib import Path

from airflow_provider_logbus.storage import Storage, join

ERROR_FILE = "_logbus_error.json"
SPARK_LOG = "_logbus_spark.log"
MAX_MESSAGE = 2000

_TRACEBACK = "Traceback (most recent call last):"
# after a traceback's indented frames, Python prints `module.Type: message`
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*): (.+)$")
_WRAPPERS = ("PythonException", "Py4JJavaError", "SparkException", "AnalysisException", "StreamingQueryException")


def root_cause(exc: BaseException) -> tuple[str, str]:
    """(type name, message) of what really failed: for Spark's wrappers, the last
    exception line of the first Python traceback in their text; else `exc` itself."""
    text = str(exc)
    if type(exc).__name__ in _WRAPPERS or _TRACEBACK in text:
        found = _first_traceback_exception(text)
        if found is not None:
            return found
    first_line = text.strip().splitlines()[0] if text.strip() else ""
    return type(exc).__name__, first_line[:MAX_MESSAGE]


def _first_traceback_exception(text: str) -> tuple[str, str] | None:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if _TRACEBACK not in line:
            continue
        for following in lines[i + 1:]:
            if not following.strip() or following[:1].isspace():
                continue  # a frame
            match = _EXCEPTION_LINE.match(following.strip())
            if match:
                return match.group(1), match.group(2).strip()[:MAX_MESSAGE]
            break
    return None


def write_failure(staging: str | Path, exc: BaseException, storage: Storage | None = None) -> str:
    """Record `exc`'s root cause in `<staging>/_logbus_error.json` (atomically)."""
    kind, message = root_cause(exc)
    storage = storage or Storage()
    storage.make_dirs(str(staging))
    path = join(str(staging), ERROR_FILE)
    storage.write_json(path, {"type": kind, "message": message, "raised": type(exc).__name__})
    return path


def read_failure(staging: str | Path, storage: Storage | None = None) -> dict | None:
    """{"type", "message", "raised"} recorded by a failed job, or None."""
    try:
        return (storage or Storage()).read_json(join(str(staging), ERROR_FILE))
    except (OSError, ValueError):
        return None
