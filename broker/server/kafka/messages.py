"""Building kio responses of whatever version a request came in: Kafka's messages gain
and lose fields from version to version, and kio has one frozen dataclass per version,
so a handler names the fields it knows and `build` keeps those its version has."""

from __future__ import annotations

import dataclasses
import datetime
import sys
from functools import lru_cache
from types import ModuleType
from typing import Any

from kio.index import load_response_schema


@lru_cache(maxsize=None)
def response_module(api_key: int, version: int) -> ModuleType:
    """The kio module of a response version: its message class and nested entities."""
    return sys.modules[load_response_schema(api_key, version).__module__]


@lru_cache(maxsize=None)
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def build(cls: type, /, **fields: Any) -> Any:
    """`cls(**fields)` without the fields its version lacks."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in fields.items() if k in names})


def response(api_key: int, version: int, /, **fields: Any) -> Any:
    """The top-level response message of `api_key` at `version`."""
    return build(load_response_schema(api_key, version), **fields)


def entity(api_key: int, version: int, entity_name: str, /, **fields: Any) -> Any:
    """A nested entity of a response (e.g. "MetadataResponseTopic") at `version`."""
    return build(getattr(response_module(api_key, version), entity_name), **fields)


def field(request: Any, name: str, default: Any = None) -> Any:
    """A request field, or `default` in versions without it."""
    return getattr(request, name, default)


NO_THROTTLE = datetime.timedelta(0)  # logbus enforces no quotas: every response's throttle time


_EMPTY = {"string": "", "bytes": b"", "bool": False, "records": None, "uuid": None}


def error_response(api_key: int, version: int, error: Any, message: str | None = None) -> Any:
    """A response of any API saying `error` and nothing else: its error code(s) set,
    lists empty, numbers zero, defaults kept — what a client gets for a request the
    listener refuses whole (an API it does not serve, a request a handler could not
    read), instead of a closed connection. Kafka builds these per API
    (`AbstractRequest.getErrorResponse`); the schema lets one function do it."""
    cls = load_response_schema(api_key, version)
    fields = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        kind = f.metadata.get("kafka_type")
        if f.name == "error_message" or kind == "error_message":
            fields[f.name] = message
        elif kind == "error_code":
            fields[f.name] = error
        elif kind == "timedelta_i32":
            fields[f.name] = NO_THROTTLE
        elif kind in _EMPTY:
            fields[f.name] = _EMPTY[kind]
        elif kind is None:
            fields[f.name] = ()  # an array of entities
        else:
            fields[f.name] = 0  # a number
    if "error_message" in _field_names(cls):
        fields["error_message"] = message
    return cls(**fields)
