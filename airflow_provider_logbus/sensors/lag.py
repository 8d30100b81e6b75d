"""LogbusLagSensor: waits until a topic has enough new data, or until the run's interval
is complete on the brokers."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Sequence

from airflow.providers.common.compat.sdk import AirflowException, BaseSensorOperator

from airflow_provider_logbus.hooks.logbus import LogbusHook
from airflow_provider_logbus.triggers.lag import LogbusLagTrigger, check_ready


class LogbusLagSensor(BaseSensorOperator):
    """Succeeds when (a) `group`'s lag on `topic` is at least `min_lag` records, or (b) with
    `wait_for_interval_end`, every partition holds data stamped after the run's
    data-interval end plus `grace` (found with OFFSETS time lookups, no data read).

    `deferrable=True` hands the waiting to `LogbusLagTrigger` in the triggerer.
    """

    template_fields: Sequence[str] = ("topic", "group", "min_lag")

    def __init__(self, *, topic: str, group: str | None = None, min_lag: int | None = None,
                 wait_for_interval_end: bool = True, grace: timedelta = timedelta(minutes=5),
                 logbus_conn_id: str = LogbusHook.default_conn_name, deferrable: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if min_lag is None and not wait_for_interval_end:
            raise ValueError("LogbusLagSensor needs min_lag (with group) or wait_for_interval_end=True")
        self.topic, self.group, self.min_lag = topic, group, min_lag
        self.wait_for_interval_end, self.grace = wait_for_interval_end, grace
        self.logbus_conn_id, self.deferrable = logbus_conn_id, deferrable
        self._hook: LogbusHook | None = None
        self._last_state: dict | None = None

    def _complete_after_ms(self, context) -> int | None:
        if not self.wait_for_interval_end:
            return None
        end = context.get("data_interval_end")
        if end is None:
            raise AirflowException("wait_for_interval_end needs a run with a data interval")
        return int((end + self.grace).timestamp() * 1000)

    def _min_lag(self) -> int | None:
        return None if self.min_lag in (None, "", "None") else int(self.min_lag)

    def poke(self, context) -> bool:
        # poke mode: one hook (one ZooKeeper session) for every poke of this try, closed
        # when execute() ends; reschedule mode: the sensor is rebuilt per poke, close now
        if self._hook is None:
            self._hook = LogbusHook(self.logbus_conn_id)
        try:
            ready, details = check_ready(self._hook.get_conn(), self.topic, self.group, self._min_lag(),
                                         self._complete_after_ms(context))
        except Exception:
            self._close_hook()
            raise
        finally:
            if self.mode == "reschedule":
                self._close_hook()
        state = {k: v for k, v in details.items() if k != "lag"}  # lag moves at every poke
        if ready or state != self._last_state:
            self.log.info("%s: %s", "ready" if ready else "waiting", details)
            self._last_state = state
        return ready

    def _close_hook(self) -> None:
        if self._hook is not None:
            self._hook.close()
            self._hook = None

    def execute(self, context) -> Any:
        if not self.deferrable:
            try:
                return super().execute(context)
            finally:
                self._close_hook()
        address = LogbusHook(self.logbus_conn_id).cluster_address()
        self.defer(
            trigger=LogbusLagTrigger(
                topic=self.topic, zookeeper=address["zookeeper"], brokers=address["brokers"], group=self.group,
                min_lag=self._min_lag(), complete_after_ms=self._complete_after_ms(context),
                poll_interval=self.poke_interval,
                timeout=self.timeout.total_seconds() if isinstance(self.timeout, timedelta) else self.timeout,
                cluster_timeout=address["timeout"], logbus_conn_id=self.logbus_conn_id,
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context, event: dict[str, Any]) -> dict:
        status = event.get("status")
        if status == "success":
            self.log.info("ready: %s", event.get("reason"))
            return event
        if status == "timeout":
            raise AirflowException(f"timed out waiting for data on {self.topic}: {event}")
        raise AirflowException(f"LogbusLagTrigger failed: {event.get('message', event)}")
