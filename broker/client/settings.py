"""Numeric client settings checked before any connection opens.

A setting below its floor does not fail where it is set: a fetch size of 0 asks for
nothing forever, a queue of 0 or a negative timeout fails later with an error that no
longer names it, a string read from a config file fails deep in a thread. So each
client names its floors and refuses the rest at construction, by name.
"""

from __future__ import annotations

from typing import Mapping


def require_at_least(settings: Mapping[str, object], lowest: Mapping[str, int]) -> None:
    """Raise `ValueError` for the first setting in `lowest` that is not an integer at
    least its floor; a setting given as None (optional and unset) passes. `settings` is
    the constructor's arguments (its `locals()` before anything else is bound)."""
    for name, floor in lowest.items():
        value = settings[name]
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < floor:
            raise ValueError(f"{name} must be an integer of at least {floor}, not {value!r}")
