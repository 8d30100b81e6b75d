"""LogbusLagTrigger: waits, in the triggerer, until there is enough data to load."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_logbus.cluster import LogbusCluster


def check_ready(cluster: LogbusCluster, topic: str, group: str | None, min_lag: int | None,
                complete_after_ms: int | None) -> tuple[bool, dict]:
    """(ready, details): ready when the group's total lag on `topic` is at least `min_lag`
    bytes, or when every partition holds a message stamped after `complete_after_ms`."""
    details: dict[str, Any] = {"topic": topic}
    if min_lag is not None and group:
        lag = cluster.lag(group, topic)
        details["lag"] = {str(p): n for p, n in lag.items()}
        if sum(lag.values()) >= min_lag:
            return True, {**details, "reason": f"lag {sum(lag.values())} >= {min_lag} bytes"}
    if complete_after_ms is not None:
        behind = [p for p in cluster.partitions(topic) if not cluster.has_data_after(topic, p, complete_after_ms)]
        details["partitions_without_later_data"] = behind
        if not behind:
            return True, {**details, "reason": f"every partition has data after {complete_after_ms}"}
    return False, details


class LogbusLagTrigger(BaseTrigger):
    """Polls every `poll_interval` seconds; yields one event: {"status": "success", ...}
    or {"status": "error", "message": ...} or {"status": "timeout", ...}."""

    def __init__(self, topic: str, zookeeper: str | None = None, brokers: str | None = None,
                 group: str | None = None, min_lag: int | None = None, complete_after_ms: int | None = None,
                 poll_interval: float = 10.0, timeout: float | None = None) -> None:
        super().__init__()
        self.topic, self.zookeeper, self.brokers, self.group = topic, zookeeper, brokers, group
        self.min_lag, self.complete_after_ms = min_lag, complete_after_ms
        self.poll_interval, self.timeout = poll_interval, timeout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"topic": self.topic, "zookeeper": self.zookeeper, "brokers": self.brokers, "group": self.group,
             "min_lag": self.min_lag, "complete_after_ms": self.complete_after_ms,
             "poll_interval": self.poll_interval, "timeout": self.timeout},
        )

    def _check(self) -> tuple[bool, dict]:
        with LogbusCluster(self.zookeeper, self.brokers) as cluster:
            return check_ready(cluster, self.topic, self.group, self.min_lag, self.complete_after_ms)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout
        details: dict = {}
        while True:
            try:
                ready, details = await asyncio.to_thread(self._check)
            except Exception as exc:  # the sensor decides what an error means
                yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
                return
            if ready:
                yield TriggerEvent({"status": "success", **details})
                return
            if deadline is not None and loop.time() >= deadline:
                yield TriggerEvent({"status": "timeout", **details})
                return
            await asyncio.sleep(self.poll_interval)
