"""The Airflow plugin: the "Logbus" page in the UI's navigation (Browse), served by the
api-server itself at `/logbus/` (`app.py`). Registered through Airflow's plugin entry
point (`airflow.plugins` in pyproject.toml), so installing the package is enough —
the provider entry point's plugins are read only with `lazy_discover_providers` off.

Every Airflow process loads plugins — the scheduler, the triggerer, each task — so this
module imports nothing but Airflow's plugin class: the page's app (FastAPI, Airflow's
API security, pyarrow through the targets) is built at its first request (`PageApp`),
in the api-server only.
"""

from __future__ import annotations

from airflow.providers.common.compat.sdk import AirflowPlugin

URL_PREFIX = "/logbus"


class PageApp:
    """An ASGI app that builds the page's FastAPI app (`app.create_app`) at the first
    request the api-server routes to it."""

    def __init__(self) -> None:
        self._app = None

    async def __call__(self, scope, receive, send) -> None:
        if self._app is None:
            from airflow_provider_logbus.ui.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class LogbusPlugin(AirflowPlugin):
    name = "logbus"
    fastapi_apps = [{"app": PageApp(), "url_prefix": URL_PREFIX, "name": "logbus"}]
    external_views = [{
        "name": "Logbus", "href": f"{URL_PREFIX}/", "destination": "nav", "category": "browse",
        "url_route": "logbus",
    }]
