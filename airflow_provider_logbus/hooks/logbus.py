"""LogbusHook: the provider's one door to a logbus cluster (DESIGN §7).

Connection `logbus` (default id `logbus_default`):

* Host / Port: a ZooKeeper server; Schema: its chroot (e.g. `logbus`), or
* Extra `{"zookeeper": "h1:2181,h2:2181/logbus"}`, or `{"brokers": "h:9092,h:9093"}`
  (static brokers, answered with METADATA; no group offsets then), and optionally
  `{"timeout": 15}` (seconds).

Usable from plain Python without a connection: `LogbusHook(zookeeper="127.0.0.1:2181/x")`.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from airflow.providers.common.compat.sdk import AirflowException, AirflowNotFoundException, BaseHook

from airflow_provider_logbus.cluster import ClusterConfigError, LogbusCluster, PartitionOffsets
from airflow_provider_logbus.batch import DataLossError, PlanError, commit_batch, plan_batch
from airflow_provider_logbus.plan import BatchPlan
from airflow_provider_logbus.targets import CommitTarget
from airflow_provider_logbus.targets.directory import DirectoryTarget

log = logging.getLogger(__name__)


class LogbusConnectionError(AirflowException):
    """The logbus connection is missing or unusable; the message names it and the fix."""


class LogbusDataLossError(AirflowException):
    """Retention deleted bytes that were never loaded."""


class LogbusHook(BaseHook):
    conn_name_attr = "logbus_conn_id"
    default_conn_name = "logbus_default"
    conn_type = "logbus"
    hook_name = "Logbus"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden-fields": ["login", "password"],
            "relabeling": {"host": "ZooKeeper host", "port": "ZooKeeper port", "schema": "ZooKeeper chroot"},
            "placeholders": {
                "host": "127.0.0.1",
                "port": "2181",
                "schema": "logbus (optional chroot)",
                "extra": '{"zookeeper": "zk1:2181,zk2:2181/logbus"} or {"brokers": "b1:9092,b2:9092"}, '
                         '"timeout": 15',
            },
        }

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        try:
            from flask_appbuilder.fieldwidgets import BS3TextFieldWidget
            from flask_babel import lazy_gettext
            from wtforms import IntegerField, StringField
            from wtforms.validators import Optional
        except ImportError:  # Airflow 3 UI without the FAB stack: provider info's conn-fields serve it
            return {}
        return {
            "zookeeper": StringField(lazy_gettext("ZooKeeper connect string"), widget=BS3TextFieldWidget(),
                                     description="h1:2181,h2:2181/chroot (overrides host/port)",
                                     validators=[Optional()]),
            "brokers": StringField(lazy_gettext("Static brokers"), widget=BS3TextFieldWidget(),
                                   description="h:9092,h:9093 when ZooKeeper is not reachable", validators=[Optional()]),
            "timeout": IntegerField(lazy_gettext("Timeout (s)"), widget=BS3TextFieldWidget(), default=15,
                                    validators=[Optional()]),
        }

    def __init__(self, logbus_conn_id: str = default_conn_name, *, zookeeper: str | None = None,
                 brokers: str | None = None, timeout: float | None = None) -> None:
        super().__init__()
        self.logbus_conn_id = logbus_conn_id
        self._zookeeper, self._brokers, self._timeout = zookeeper, brokers, timeout
        self._cluster: LogbusCluster | None = None

    # ------------------------------------------------------------------ connection

    def cluster_address(self) -> dict[str, Any]:
        """{"zookeeper": ..., "brokers": ..., "timeout": ...} from arguments or the connection."""
        if self._zookeeper or self._brokers:
            return {"zookeeper": self._zookeeper, "brokers": self._brokers, "timeout": self._timeout or 15.0}
        cid = self.logbus_conn_id
        try:
            conn = self.get_connection(cid)
        except AirflowNotFoundException:
            raise LogbusConnectionError(
                f"Airflow connection {cid!r} is not defined: create a connection of type 'logbus' with the "
                "ZooKeeper host/port (and chroot as schema), or extra {\"zookeeper\": \"h:p/chroot\"} or "
                "{\"brokers\": \"h:p,...\"}; e.g. AIRFLOW_CONN_" + cid.upper() +
                "='{\"conn_type\": \"logbus\", \"extra\": {\"zookeeper\": \"127.0.0.1:2181/logbus\"}}'"
            ) from None
        if conn.conn_type and conn.conn_type != "logbus":
            raise LogbusConnectionError(
                f"Airflow connection {cid!r} has type {conn.conn_type!r}, expected 'logbus'")
        extra = conn.extra_dejson or {}
        zookeeper, brokers = extra.get("zookeeper"), extra.get("brokers")
        if not zookeeper and not brokers:
            if not conn.host:
                raise LogbusConnectionError(
                    f"Airflow connection {cid!r} names no cluster: set its host (and port) to a ZooKeeper server, "
                    "or extra 'zookeeper' or 'brokers'")
            zookeeper = f"{conn.host}:{conn.port or 2181}"
            if conn.schema:
                zookeeper += "/" + conn.schema.strip("/")
        try:
            timeout = float(extra.get("timeout", 15))
        except (TypeError, ValueError):
            raise LogbusConnectionError(
                f"Airflow connection {cid!r}: extra 'timeout' must be a number of seconds, got {extra.get('timeout')!r}"
            ) from None
        return {"zookeeper": zookeeper, "brokers": brokers, "timeout": timeout}

    def get_conn(self) -> LogbusCluster:
        if self._cluster is None:
            address = self.cluster_address()
            try:
                self._cluster = LogbusCluster(address["zookeeper"], address["brokers"], address["timeout"])
            except ClusterConfigError as exc:
                raise LogbusConnectionError(f"logbus connection {self.logbus_conn_id!r}: {exc}") from None
        return self._cluster

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def test_connection(self) -> tuple[bool, str]:
        try:
            cluster = self.get_conn()
            brokers = cluster.brokers()
            if not brokers:
                return False, "the cluster has no live brokers registered"
            topics = cluster.topics()
            return True, f"{len(brokers)} live broker(s), {len(topics)} topic(s)"
        except Exception as exc:  # test_connection reports, never raises
            return False, f"{type(exc).__name__}: {exc}"
        finally:
            self.close()

    # ------------------------------------------------------------------ cluster facts

    def topics(self) -> list[str]:
        return self.get_conn().topics()

    def partitions(self, topic: str) -> list[int]:
        return self.get_conn().partitions(topic)

    def offsets(self, topic: str) -> dict[int, PartitionOffsets]:
        """Earliest and latest offsets of every partition, from each partition's leader."""
        return self.get_conn().partition_offsets(topic)

    def group_offsets(self, group: str, topic: str) -> dict[int, int]:
        return self.get_conn().group_offsets(group, topic)

    def set_group_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        self.get_conn().set_group_offsets(group, topic, offsets)

    def lag(self, group: str, topic: str) -> dict[int, int]:
        return self.get_conn().lag(group, topic)

    def producer(self, **kwargs):
        """A `broker.client.producer.Producer` on this cluster."""
        from broker.client.producer import Producer

        address = self.cluster_address()
        if address["zookeeper"]:
            return Producer(zookeeper=address["zookeeper"], **kwargs)
        return Producer(brokers=address["brokers"], **kwargs)

    def consumer(self, topic: str, partition: int, **kwargs):
        """A `broker.client.consumer.SimpleConsumer` of one partition on this cluster."""
        from broker.client.consumer import SimpleConsumer

        address = self.cluster_address()
        if address["zookeeper"]:
            return SimpleConsumer(topic, partition, zookeeper=address["zookeeper"], **kwargs)
        return SimpleConsumer(topic, partition, brokers=address["brokers"], **kwargs)

    def consumer_group(self, group: str, topics: dict[str, int], **kwargs):
        from broker.client.group import ConsumerGroup

        return ConsumerGroup(group, topics, zookeeper=self.cluster_address()["zookeeper"], **kwargs)

    # ------------------------------------------------------------------ the batch protocol (batch.py)

    def snapshot_ranges(self, *, table: str, topic: str, interval_start: datetime, interval_end: datetime,
                        warehouse: str | None = None, target: CommitTarget | None = None, group: str | None = None,
                        auto_offset_reset: str = "earliest", max_bytes_per_partition: int | None = None,
                        on_data_loss: str = "fail") -> dict:
        """The ranges of this interval's batch as XCom wants them (`batch.plan_batch`)."""
        target = target or DirectoryTarget(warehouse or "", table)
        try:
            plan = plan_batch(self.get_conn(), target, topic, interval_start, interval_end, group=group,
                              auto_offset_reset=auto_offset_reset, max_bytes_per_partition=max_bytes_per_partition,
                              on_data_loss=on_data_loss)
        except DataLossError as exc:
            raise LogbusDataLossError(str(exc)) from None
        except PlanError as exc:
            raise AirflowException(str(exc)) from None
        return {**plan.to_dict(), "warehouse": str(warehouse or "")}

    def commit_batch(self, *, table: str, plan: dict, staging: str | None, run_id: str,
                     warehouse: str | None = None, target: CommitTarget | None = None,
                     group: str | None = None) -> dict:
        """Publish the staged batch (compare-and-swap on the table's offsets), then mirror
        the offsets to the group in ZooKeeper (lag monitoring only)."""
        target = target or DirectoryTarget(warehouse or "", table)
        result = commit_batch(target, BatchPlan.from_dict(plan), staging, run_id,
                              cluster=self.get_conn() if group else None, group=group)
        return {**result.record.to_dict(), "published_now": result.published_now}

    def audit(self, *, table: str, topic: str, start_ms: int, end_ms: int, threshold: float,
              warehouse: str | None = None, target: CommitTarget | None = None,
              monitoring_topic: str = "_logbus_audit") -> dict:
        from airflow_provider_logbus.completeness import build_report

        target = target or DirectoryTarget(warehouse or "", table)
        produced, batches = self.audit_inputs(target, monitoring_topic)
        return build_report(table, topic, start_ms, end_ms, produced, batches, threshold)

    def audit_inputs(self, target: CommitTarget, monitoring_topic: str = "_logbus_audit"):
        """(messages produced per (topic, window) from the monitoring events, the
        table's committed batches): what the audit compares."""
        from airflow_provider_logbus.monitoring import read_produced_counts

        return read_produced_counts(self.get_conn(), monitoring_topic), target.batches()
