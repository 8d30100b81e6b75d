"""LogbusLagTrigger: waits, in the triggerer, until there is enough data to load."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_logbus.cluster import LogbusCluster
from broker.client.security import OPEN

log = logging.getLogger(__name__)
DEFAULT_CLUSTER_TIMEOUT = 15.0


def check_ready(cluster: LogbusCluster, topic: str, group: str | None, min_lag: int | None,
                complete_after_ms: int | None) -> tuple[bool, dict]:
    """(ready, details): ready when the group's total lag on `topic` is at least `min_lag`
    records (`LogbusCluster.lag`), or when every partition holds a message stamped after
    `complete_after_ms`."""
    details: dict[str, Any] = {"topic": topic}
    if min_lag is not None and group:
        lag = cluster.lag(group, topic)
        details["lag"] = {str(p): n for p, n in lag.items()}
        if sum(lag.values()) >= min_lag:
            return True, {**details, "reason": f"lag {sum(lag.values())} >= {min_lag} records"}
    if complete_after_ms is not None:
        behind = [p for p in cluster.partitions(topic) if not cluster.has_data_after(topic, p, complete_after_ms)]
        details["partitions_without_later_data"] = behind
        if not behind:
            return True, {**details, "reason": f"every partition has data after {complete_after_ms}"}
    return False, details


class LogbusLagTrigger(BaseTrigger):
    """Polls every `poll_interval` seconds; yields one event: {"status": "success", ...}
    or {"status": "error", "message": ...} or {"status": "timeout", ...}.

    One ZooKeeper session (and one connection per broker) serves every poll of a run:
    opened at the first poll, closed when the trigger ends or is cancelled.
    `cluster_timeout` is the connection's `timeout` (seconds for ZooKeeper and broker
    calls); `timeout` is the sensor's, the wait as a whole. The waiting state is logged
    when it changes, not at every poll."""

    def __init__(self, topic: str, zookeeper: str | None = None, brokers: str | None = None,
                 group: str | None = None, min_lag: int | None = None, complete_after_ms: int | None = None,
                 poll_interval: float = 10.0, timeout: float | None = None,
                 cluster_timeout: float = DEFAULT_CLUSTER_TIMEOUT, logbus_conn_id: str | None = None) -> None:
        super().__init__()
        # a secured cluster's credentials are read from the connection in the triggerer,
        # never serialized into the trigger's row
        self.logbus_conn_id = logbus_conn_id
        self.topic, self.zookeeper, self.brokers, self.group = topic, zookeeper, brokers, group
        self.min_lag, self.complete_after_ms = min_lag, complete_after_ms
        self.poll_interval, self.timeout, self.cluster_timeout = poll_interval, timeout, cluster_timeout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"topic": self.topic, "zookeeper": self.zookeeper, "brokers": self.brokers, "group": self.group,
             "min_lag": self.min_lag, "complete_after_ms": self.complete_after_ms,
             "poll_interval": self.poll_interval, "timeout": self.timeout, "cluster_timeout": self.cluster_timeout,
             "logbus_conn_id": self.logbus_conn_id},
        )

    def _cluster(self) -> LogbusCluster:
        security = OPEN
        if self.logbus_conn_id:
            from airflow_provider_logbus.hooks.logbus import LogbusHook

            security = LogbusHook(self.logbus_conn_id).client_security()
        return LogbusCluster(self.zookeeper, self.brokers, timeout=self.cluster_timeout, client_id="logbus-trigger",
                             security=security)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout
        last_state = None
        try:  # off the loop: reading the connection (secured clusters) is a blocking call
            cluster = await asyncio.to_thread(self._cluster)
        except Exception as exc:
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
            return
        poll: asyncio.Future | None = None
        try:
            while True:
                try:
                    # shielded: a cancel must not leave the poll's thread using the cluster
                    # while `finally` closes it (the thread could reopen a session)
                    poll = asyncio.ensure_future(asyncio.to_thread(
                        check_ready, cluster, self.topic, self.group, self.min_lag, self.complete_after_ms))
                    ready, details = await asyncio.shield(poll)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the sensor decides what an error means
                    event = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
                    break
                if ready:
                    event = {"status": "success", **details}
                    break
                state = {k: v for k, v in details.items() if k != "lag"}  # lag moves at every poll
                if state != last_state:
                    log.info("waiting for %s: %s", self.topic, details)
                    last_state = state
                if deadline is not None and loop.time() >= deadline:
                    event = {"status": "timeout", **details}
                    break
                await asyncio.sleep(self.poll_interval)
            # closed before the event goes out: the triggerer may never resume this generator
            await asyncio.to_thread(cluster.close)
            yield TriggerEvent(event)
        finally:
            if poll is not None and not poll.done():  # cancelled while polling: let the poll end first
                await asyncio.wait([poll])
            await asyncio.shield(asyncio.to_thread(cluster.close))  # idempotent
