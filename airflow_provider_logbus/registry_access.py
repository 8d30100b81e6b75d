"""How the provider reaches a schema registry (docs/schemas.md, "Loads"): one URL or
several (tried in turn when one is unreachable), HTTPS against a CA file, HTTP Basic
credentials — for the load's executors (writer schemas by id), the load task's
`schema_subject` and `LogbusSchemaCheckOperator` (a subject's latest version) alike.

Two kinds of failure, kept apart: an id or subject the registry does not know (404,
`UnknownSchema`: the data's or the DAG's fault) and the registry refusing the
credentials, its TLS failing or every URL being down (`RegistryUnavailable`: not the
data's fault; the task fails and Airflow's retries apply). The credentials reach a
Spark job in its environment (`REGISTRY_ENV`, JSON with confluent_kafka's property
names), never on its command line. Plain Python: no Airflow, no Spark.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field

REGISTRY_ENV = "LOGBUS_SCHEMA_REGISTRY"
TIMEOUT_S = 30


class RegistryUnavailable(RuntimeError):
    """The registry cannot answer the load (credentials, TLS, down): the load fails."""


class UnknownSchema(LookupError):
    """The registry answered 404 for an id: the value is a reject."""


@dataclass(frozen=True)
class RegistryAccess:
    """Where the registry is (`url`: one, or several comma-separated, tried in turn when
    one is unreachable) and how to reach it."""

    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    cafile: str | None = None

    @classmethod
    def from_properties(cls, url: str, properties: dict[str, str]) -> "RegistryAccess":
        """confluent_kafka's `SchemaRegistryClient` properties: `basic.auth.user.info`
        (user:password) and `ssl.ca.location`."""
        user_info = properties.get("basic.auth.user.info") or ""
        username, _, password = user_info.partition(":")
        return cls(url, username or None, password if username else None, properties.get("ssl.ca.location") or None)

    @classmethod
    def from_environment(cls, url: str) -> "RegistryAccess":
        """`url` reached with the properties in `REGISTRY_ENV` (none: an open registry)."""
        text = os.environ.get(REGISTRY_ENV)
        return cls.from_properties(url, json.loads(text) if text else {})

    @property
    def urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in self.url.split(",") if u.strip()]

    def get(self, path: str) -> dict:
        """The JSON answer to GET `path`; `UnknownSchema` on a 404, `RegistryUnavailable`
        when no registry answers it otherwise."""
        failure = None
        for url in self.urls:
            request = urllib.request.Request(url + path, headers=self._headers())
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self._tls(url)) as answer:
                    return json.loads(answer.read())
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    raise UnknownSchema(f"HTTP 404: {_message(exc, with_code=True)}") from None
                failure = self._refusal(url, exc)
                if exc.code in (401, 403):
                    break  # an answer, not an outage: another registry answers the same
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, ssl.SSLError):
                    failure = RegistryUnavailable(
                        f"schema registry {url}: TLS failed ({reason}): check the schema registry connection's "
                        f"CA file (ssl_cafile)")
                else:
                    failure = RegistryUnavailable(f"schema registry {url} is unreachable: {reason}")
        raise failure or RegistryUnavailable(f"no schema registry URL in {self.url!r}")

    def check(self) -> None:
        """Raise `RegistryUnavailable` unless the registry answers with these credentials
        (`GET /schemas/types`, which any authenticated user may read): run on the driver,
        so a wrong password fails the load before anything is read."""
        self.get("/schemas/types")

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if self.username:
            token = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        return headers

    def _tls(self, url: str) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=self.cafile) if url.startswith("https:") else None

    def _refusal(self, url: str, exc: urllib.error.HTTPError) -> RegistryUnavailable:
        if exc.code == 401:
            if not self.username:
                return RegistryUnavailable(f"schema registry {url} asks for credentials (HTTP 401) and the load has "
                                           f"none: give the schema registry connection a login and password")
            return RegistryUnavailable(f"schema registry {url} refused the load's credentials (HTTP 401, user "
                                       f"{self.username!r}): check the schema registry connection's login and "
                                       f"password")
        if exc.code == 403:
            return RegistryUnavailable(f"schema registry {url} refused user {self.username!r} (HTTP 403: "
                                       f"{_message(exc)}): grant it Read on the topic's subjects")
        return RegistryUnavailable(f"schema registry {url} failed: HTTP {exc.code}: {_message(exc)}")


def _message(exc: urllib.error.HTTPError, with_code: bool = False) -> str:
    """The registry's error `message` (with its `error_code`, e.g. 40401), or the reason."""
    try:
        error = json.loads(exc.read())
        message = str(error.get("message", exc.reason))
        return f"error {error['error_code']}: {message}" if with_code and "error_code" in error else message
    except (ValueError, AttributeError, OSError):
        return str(exc.reason)
