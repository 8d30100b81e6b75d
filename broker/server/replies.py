"""The shape every request handler returns (`broker.server.handlers`,
`broker.server.auth.sasl`): a `Reply`, the future of a response body, resolved at once
(`answered`) or when what it waits for is done (`later`)."""

from __future__ import annotations

import asyncio
from typing import Coroutine

Reply = asyncio.Future  # of Body | None


def answered(body) -> Reply:
    """A reply known at once."""
    reply = asyncio.get_running_loop().create_future()
    reply.set_result(body)
    return reply


def later(answer: Coroutine) -> Reply:
    """A reply that waits (for a flush, data, ZooKeeper, or a handshake step)."""
    return asyncio.ensure_future(answer)
