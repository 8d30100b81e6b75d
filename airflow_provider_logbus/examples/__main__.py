"""`python -m airflow_provider_logbus.examples DAG_FOLDER [--force] [--broker-properties FILE]`:
copy the example DAGs and the simulator into an Airflow DAG folder."""

from __future__ import annotations

import argparse
import sys

from airflow_provider_logbus.examples import ExampleExistsError, copy_examples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_logbus.examples",
        description="Copy logbus's example DAGs (hourly load, daily audit, complete hours) and the web-server "
                    "simulator into an Airflow DAG folder.")
    parser.add_argument("dag_folder", help="the DAG folder, e.g. $AIRFLOW_HOME/dags (created if missing)")
    parser.add_argument("--force", action="store_true", help="overwrite files that exist with other content")
    parser.add_argument("--broker-properties", metavar="FILE",
                        help="also write the example broker configuration to FILE (logbus-broker --config FILE)")
    args = parser.parse_args(argv)
    try:
        written = copy_examples(args.dag_folder, overwrite=args.force, broker_properties_to=args.broker_properties)
    except ExampleExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
