"""The example DAGs, the web-server simulator and an example broker configuration,
shipped in the wheel so an installed provider has a starting point without a checkout.

    python -m airflow_provider_logbus.examples ~/airflow/dags        # copy the DAGs and the simulator
    python -m airflow_provider_logbus.examples ~/airflow/dags --broker-properties /etc/logbus/broker.properties

The checkout's `dags/examples/` and `config/broker.properties` are symbolic links to
these files, so tests, the demo and users of a checkout read the same ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
DAG_FILES = ("logbus_hourly_load.py", "logbus_daily_audit.py", "logbus_complete_hours.py",
             "logbus_table_maintenance.py")
SIMULATOR = "simulate_web_servers.py"
BROKER_PROPERTIES = "broker.properties"


def example_files() -> list[Path]:
    """The example DAG files and the simulator, as installed."""
    return [HERE / name for name in (*DAG_FILES, SIMULATOR)]


def broker_properties() -> Path:
    """The example broker configuration (`logbus-broker --config <it>`)."""
    return HERE / BROKER_PROPERTIES


class ExampleExistsError(FileExistsError):
    """A destination file exists and differs from the example (copy with overwrite=True)."""


def copy_examples(dag_folder: str | Path, overwrite: bool = False,
                  broker_properties_to: str | Path | None = None) -> list[Path]:
    """Copy the example DAGs and the simulator into `dag_folder` (created if missing) and,
    when asked, the example broker properties to `broker_properties_to`. A file that
    exists with other content is kept unless `overwrite`: raises `ExampleExistsError`
    naming every such file before copying anything. Returns the files written."""
    dag_folder = Path(dag_folder)
    plan = [(src, dag_folder / src.name) for src in example_files()]
    if broker_properties_to is not None:
        plan.append((broker_properties(), Path(broker_properties_to)))
    clashes = [str(dst) for src, dst in plan
               if dst.exists() and dst.read_bytes() != src.read_bytes()]
    if clashes and not overwrite:
        raise ExampleExistsError("these files exist and differ from the examples (use --force to overwrite): "
                                 + ", ".join(clashes))
    written = []
    for src, dst in plan:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        written.append(dst)
    return written
