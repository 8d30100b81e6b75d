"""LogbusHook: the provider's one door to a logbus cluster
(docs/provider.md, "The hook, from Airflow or plain Python"): it turns an Airflow
connection into the cluster's access (`get_conn()`, a `LogbusCluster`) and into clients
on the same cluster. What the provider does with the cluster lives elsewhere: the batch
protocol in `batch.py`, the form's fields in `connections.py`.

Connection `logbus` (default id `logbus_default`):

* Host / Port: a ZooKeeper server; Schema: its chroot (e.g. `logbus`), or
* Extra `{"zookeeper": "h1:2181,h2:2181/logbus"}`, or `{"brokers": "h:9092,h:9093"}`
  (static brokers, answered with METADATA; no group offsets then), and optionally
  `{"timeout": 15}` (seconds).

Usable from plain Python without a connection: `LogbusHook(zookeeper="127.0.0.1:2181/x")`.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import AirflowException, AirflowNotFoundException, BaseHook

from airflow_provider_logbus.cluster import ClusterConfigError, LogbusCluster
from broker.client.security import ClientSecurity
from airflow_provider_logbus.connections import LOGBUS


class LogbusConnectionError(AirflowException):
    """The logbus connection is missing or unusable; the message names it and the fix."""


class LogbusHook(BaseHook):
    conn_name_attr = "logbus_conn_id"
    default_conn_name = "logbus_default"
    conn_type = "logbus"
    hook_name = "Logbus"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return LOGBUS.ui_field_behaviour()

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        return LOGBUS.form_widgets()

    def __init__(self, logbus_conn_id: str = default_conn_name, *, zookeeper: str | None = None,
                 brokers: str | None = None, timeout: float | None = None,
                 security: dict[str, str] | None = None) -> None:
        super().__init__()
        self.logbus_conn_id = logbus_conn_id
        self._zookeeper, self._brokers, self._timeout = zookeeper, brokers, timeout
        self._security = security or {}  # client security properties, with zookeeper= or brokers=
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

    def security_properties(self) -> dict[str, str]:
        """The connection's client security as `broker.client.security` properties (the
        password and private key included: for clients and Spark executors, never for
        logs, lineage or XCom). {} for a plaintext cluster."""
        if self._zookeeper or self._brokers:
            return dict(self._security)
        conn = self.get_connection(self.logbus_conn_id)
        extra = conn.extra_dejson or {}
        properties = {"security.protocol": extra.get("security_protocol"), "listener.name": extra.get("listener"),
                      "sasl.mechanism": extra.get("sasl_mechanism"), "sasl.username": conn.login,
                      "sasl.password": conn.password, "ssl.cafile": extra.get("ssl_cafile"),
                      "ssl.ca.pem": extra.get("ssl_ca_pem"), "ssl.certfile": extra.get("ssl_certfile"),
                      "ssl.cert.pem": extra.get("ssl_cert_pem"), "ssl.keyfile": extra.get("ssl_keyfile"),
                      "ssl.private.key": extra.get("ssl_private_key"),
                      "zookeeper.ssl.cafile": extra.get("zookeeper_ssl_cafile")}
        return {k: str(v) for k, v in properties.items() if v not in (None, "")}

    def client_security(self) -> ClientSecurity:
        try:
            return ClientSecurity.from_properties(self.security_properties())
        except ValueError as exc:
            raise LogbusConnectionError(f"logbus connection {self.logbus_conn_id!r}: {exc}") from None

    def get_conn(self) -> LogbusCluster:
        if self._cluster is None:
            address = self.cluster_address()
            try:
                self._cluster = LogbusCluster(address["zookeeper"], address["brokers"], address["timeout"],
                                              security=self.client_security())
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

    # ------------------------------------------------------------------ clients on the same cluster

    def producer(self, **kwargs):
        """A `broker.client.producer.Producer` on this cluster."""
        from broker.client.producer import Producer

        address = self.cluster_address()
        kwargs.setdefault("security", self.client_security())
        if address["zookeeper"]:
            return Producer(zookeeper=address["zookeeper"], **kwargs)
        return Producer(brokers=address["brokers"], **kwargs)

    def consumer(self, topic: str, partition: int, **kwargs):
        """A `broker.client.consumer.SimpleConsumer` of one partition on this cluster."""
        from broker.client.consumer import SimpleConsumer

        address = self.cluster_address()
        kwargs.setdefault("security", self.client_security())
        if address["zookeeper"]:
            return SimpleConsumer(topic, partition, zookeeper=address["zookeeper"], **kwargs)
        return SimpleConsumer(topic, partition, brokers=address["brokers"], **kwargs)

    def consumer_group(self, group: str, topics: dict[str, int], **kwargs):
        from broker.client.group import ConsumerGroup

        kwargs.setdefault("security", self.client_security())
        return ConsumerGroup(group, topics, zookeeper=self.cluster_address()["zookeeper"], **kwargs)
