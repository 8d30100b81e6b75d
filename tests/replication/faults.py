"""Fault-injection hooks run inside a broker process (`LocalCluster.start_broker(...,
preamble=...)`): they hold one step of the broker's real code at a gate the test
controls, so that a race happens for certain instead of by luck. The broker's code is
otherwise untouched."""

from __future__ import annotations


def hold_commit_waits(gate: str) -> str:
    """A preamble under which acks=-1 answers, after their append, wait to start waiting
    for the high watermark while the file `gate` exists — the window between an append
    and its commit waiter, stretched so that leadership can move inside it."""
    return f"from tests.replication.faults import _hold_commit_waits; _hold_commit_waits({gate!r})"


def _hold_commit_waits(gate: str) -> None:
    import asyncio
    import os

    from broker.server.replication.manager import ReplicaManager

    original = ReplicaManager.wait_committed

    async def held(self, *args, **kwargs):
        while os.path.exists(gate):
            await asyncio.sleep(0.01)
        return await original(self, *args, **kwargs)

    ReplicaManager.wait_committed = held
