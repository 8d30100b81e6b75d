"""What the `logbus` subcommands share about talking to their user: the one-line error
a user can act on, and how a value that is not known prints."""

from __future__ import annotations


class CommandError(Exception):
    """A problem the user can fix; printed as one line."""


def show(value: object) -> str:
    return "-" if value is None else str(value)
