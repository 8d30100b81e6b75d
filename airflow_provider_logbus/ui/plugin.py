"""The Airflow plugin: the "Logbus" page in the UI's navigation (Browse), served by the
api-server itself at `/logbus/` (`app.py`). Registered through Airflow's plugin entry
point (`airflow.plugins` in pyproject.toml), so installing the package is enough —
the provider entry point's plugins are read only with `lazy_discover_providers` off.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_logbus.ui.app import create_app

URL_PREFIX = "/logbus"


class LogbusPlugin(AirflowPlugin):
    name = "logbus"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "logbus"}]
    external_views = [{
        "name": "Logbus", "href": f"{URL_PREFIX}/", "destination": "nav", "category": "browse",
        "url_route": "logbus",
    }]
