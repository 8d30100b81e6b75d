"""Building kio responses of whatever version a request came in: Kafka's messages gain
and lose fields from version to version, and kio has one frozen dataclass per version,
so a handler names the fields it knows and `build` keeps those its version has."""

from __future__ import annotations

import dataclasses
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


def entity(api_key: int, version: int, name: str, /, **fields: Any) -> Any:
    """A nested entity of a response (e.g. "MetadataResponseTopic") at `version`.
    Positional-only parameters: many entities have a field called `name`."""
    return build(getattr(response_module(api_key, version), name), **fields)


def field(request: Any, name: str, default: Any = None) -> Any:
    """A request field, or `default` in versions without it."""
    return getattr(request, name, default)
