"""A broker process (Kafka's KafkaServer): its logs, ZooKeeper registration, the
controller candidate, replication, the network server (`connection.py`), background
jobs (retention, idle and stalled connections), and a clean stop on SIGTERM or SIGINT
(flush, clean-shutdown marker, so the next start skips recovery)."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
import warnings

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from broker.common.errors import UnknownTopic
from broker.common.protocol import BrokerInfo
from broker.common.topicdeletion import deleted_ids
from broker.common.zkauth import NO_CHROOT, ZooKeeperAuth, protect_root
from broker.common.zklayout import CONSUMERS, MIRRORS
from broker.common.zksession import start_session
from broker.server.audit import RecordCounter, led_logs
from broker.server.auth.authorizer import Authorizer
from broker.server.auth.interbroker import InterBrokerSecurity
from broker.server.auth.listeners import broker_principal, inter_broker_listener, listeners
from broker.server.auth.tls import ReloadingContexts
from broker.server.config import BrokerConfig
from broker.server.connection import Connection
from broker.server.controller import Controller
from broker.server.flowcontrol import ConnectionLimits, RequestPool
from broker.server.handlers import RequestHandler
from broker.server.kafka.connection import KafkaConnection
from broker.server.kafka.requests import KafkaRequests
from broker.server.log.log import LogConfig
from broker.server.log.manager import LogManager
from broker.server.log.scheduler import FlushScheduler
from broker.server.producerids import ProducerIdAllocator
from broker.server.registration import BrokerRegistry
from broker.server.replication.manager import ReplicaManager

logger = logging.getLogger(__name__)


def log_config(config: BrokerConfig, topic: str) -> LogConfig:
    """A partition's settings: the broker's, with the topic's retention overrides (so
    that, say, the monitoring topic can outlive size-based retention of busy topics)."""
    return LogConfig(
        segment_bytes=config.log_segment_bytes,
        roll_ms=config.log_roll_ms,
        flush_interval_messages=config.log_flush_interval_messages,
        flush_interval_ms=config.log_flush_interval_ms,
        retention_ms=dict(config.log_retention_ms_per_topic).get(topic, config.log_retention_ms),
        retention_bytes=dict(config.log_retention_bytes_per_topic).get(topic, config.log_retention_bytes),
        max_entry_bytes=config.socket_request_max_bytes,
        producer_id_expiration_ms=config.producer_id_expiration_ms,
        open_files_max=config.log_open_files_max,
        dir_probe_interval_ms=config.log_dir_probe_interval_ms,
        dir_min_free_bytes=config.message_max_bytes,
    )


def bounded_retry(config: BrokerConfig) -> KazooRetry:
    """Retry for ever, at most `zookeeper.reconnect.backoff.max.ms` apart (one per use:
    a KazooRetry counts its attempts)."""
    return KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_jitter=0.1,
                      max_delay=config.zookeeper_reconnect_backoff_max_ms / 1000)


class Broker:
    """A broker process: logs, ZooKeeper registration, the server, background tasks."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.logs = LogManager(config.log_dirs, functools.partial(log_config, config))
        self.scheduler = FlushScheduler()
        self.listeners = listeners(config)
        inter = inter_broker_listener(config)
        self.tls = ReloadingContexts(config) if any(l.protocol.tls for l in self.listeners) else None
        self.zk_security = ZooKeeperAuth(config.zookeeper_auth, config.zookeeper_set_acl, config.zookeeper_ssl_cafile,
                                         config.zookeeper_ssl_certfile, config.zookeeper_ssl_keyfile)
        self.zk = KazooClient(
            hosts=config.zookeeper_connect,
            **self.zk_security.client_kwargs(),
            timeout=config.zookeeper_session_timeout_ms / 1000,
            # kazoo's default back-off grows to an hour: after a long ZooKeeper outage the
            # broker would stay unregistered (clients think it dead) for up to the last
            # interval. Retry at least every `zookeeper.reconnect.backoff.max.ms`.
            connection_retry=bounded_retry(config),
            # `zk.retry` (the start's ZooKeeper steps, kazoo's watches) retries a lost
            # connection until it is back, at the same bounded interval
            command_retry=bounded_retry(config),
        )
        registered = BrokerInfo(config.broker_id, inter.advertised.host, inter.advertised.port,
                                tuple(l.advertised for l in self.listeners), broker_principal(config))
        self.registry = BrokerRegistry(self.zk, registered, self._on_assignment, config.zookeeper_session_timeout_ms)
        self.registry.on_removed = self._on_removed
        self.logs.topic_id_of = lambda topic: self.registry.view.topic_ids.get(topic)
        self.authorizer = (Authorizer(self.zk, config.super_users, config.allow_everyone_if_no_acl_found)
                           if config.authorizer_enable else None)
        self.replicas = ReplicaManager(config, self.logs, self.scheduler, self.registry, self.zk,
                                       InterBrokerSecurity.from_config(config, self.tls))
        self.handler = RequestHandler(config, self.logs, self.scheduler, self.registry, self.replicas,
                                      ProducerIdAllocator(self.zk, config.broker_id), self.authorizer)
        self.kafka = KafkaRequests(self.handler)  # the Kafka listeners' requests (docs/kafka.md)
        # every broker is a controller candidate; one is active (broker.server.controller)
        self.controller = Controller(
            self.zk, config.broker_id, config.unclean_leader_election_enable,
            config.leader_imbalance_check_interval_seconds if config.auto_leader_rebalance_enable else None,
            imbalance_percentage=config.leader_imbalance_per_broker_percentage,
            session_timeout=config.zookeeper_session_timeout_ms / 1000)
        self.pool = RequestPool(config.queued_max_request_bytes)
        self.limits = ConnectionLimits(config.max_in_flight_requests, config.socket_send_buffer_max_bytes)
        self.connections: set[Connection] = set()
        self.stalled: set[Connection] = set()  # connections not being read (back-pressure)
        self._servers: list[asyncio.AbstractServer] = []  # one per listener
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def _on_assignment(self, topic: str, assignment: dict[int, list[int]]) -> None:
        """A topic seen or changed (kazoo's thread): logs of another incarnation of its
        name go (docs/storage.md, "Deleted topics"), then the logs it needs are opened."""
        self._forget_flushers(self.logs.adopt(topic, self.registry.view.topic_ids.get(topic)))
        for partition, replicas in assignment.items():
            if len(replicas) == 1 and replicas[0] == self.config.broker_id:
                self.logs.get_or_create(topic, partition)
        self.replicas.on_assignment(topic, assignment)

    def _on_removed(self, topic: str) -> None:
        """A topic deleted (kazoo's thread): stop replicating it, remove its logs."""
        self.replicas.forget_topic(topic)
        self._forget_flushers(self.logs.remove_topic(topic))

    def _forget_flushers(self, removed: list) -> None:
        if removed and self._loop is not None:
            error = UnknownTopic(f"topic {removed[0].topic!r} was deleted")
            for log in removed:
                self._loop.call_soon_threadsafe(self.scheduler.forget, log, error)

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.logs.load)
        self.replicas.start(loop)
        # kazoo warns when the chroot does not exist yet; a broker creates it itself
        # (`_prepare_zookeeper`, registration), so on a new cluster that is no news (issue 39)
        warnings.filterwarnings("ignore", message="No chroot path exists", module="kazoo.client")
        await loop.run_in_executor(None, start_session, self.zk, self.config.zookeeper_connection_timeout_ms / 1000)
        await loop.run_in_executor(None, self._prepare_zookeeper)
        await loop.run_in_executor(None, self.registry.start)
        # the topics are known now (the watches read them): a deletion missed while down is finished here
        await loop.run_in_executor(None, lambda: self.logs.remove_strays(set(self.registry.view.topics),
                                                                         deleted_ids(self.zk)))
        for listener in self.listeners:
            self._servers.append(await loop.create_server(
                functools.partial(KafkaConnection if listener.kafka else Connection, self, listener), listener.bind.host or None, listener.bind.port,
                ssl=self.tls.server if listener.protocol.tls else None, reuse_address=True, backlog=512,
            ))
        await loop.run_in_executor(None, self.registry.register)
        await loop.run_in_executor(None, self.controller.start)
        await self.kafka.groups.start()
        self._tasks = [
            asyncio.ensure_future(self._every(self.config.log_retention_check_interval_ms, self._retention)),
            asyncio.ensure_future(self._every(1000, self._close_stale_connections)),
            asyncio.ensure_future(self._every(100, self._recheck_stalled)),
        ]
        if self.config.audit_count_interval_ms:  # the audit's broker tier (broker.server.audit)
            counter = RecordCounter.of(self.config, self.zk, functools.partial(led_logs, self.handler))
            self._tasks.append(asyncio.ensure_future(self._every(self.config.audit_count_interval_ms, counter.round)))
        if self.tls is not None:
            self._tasks.append(asyncio.ensure_future(self._every(self.config.ssl_reload_interval_ms, self._reload_tls)))
        logger.info("broker %d serving on %s", self.config.broker_id,
                    ", ".join(f"{l.bind} ({l.protocol.value}, advertised {l.advertised})" for l in self.listeners))

    def _prepare_zookeeper(self) -> None:
        """On a secured ZooKeeper (`zookeeper.set.acl`): the cluster's root made its own
        (`broker.common.zkauth.protect_root`: created, or an open chroot protected; a
        start that cannot refuses) — a cluster at ZooKeeper's own root is only warned
        about, since moving it stops the brokers and changes every client's connect
        string; the consumers' and the mirrors' subtrees created open, for clients. The
        ACL watches start before we serve. Like every ZooKeeper step of the start, each
        retries a lost connection: a ZooKeeper server dying under a starting broker must
        not end it."""
        if self.zk_security.enabled:
            if not self.zk.chroot:
                logger.warning("zookeeper.set.acl is on, but %s", NO_CHROOT)
            elif done := self.zk.retry(protect_root, self.zk, self.zk_security):
                logger.warning("%s", done)
            for path in (CONSUMERS, MIRRORS):
                self.zk.retry(self.zk.ensure_path, path, acl=self.zk_security.open_acl)
        if self.authorizer is not None:
            self.authorizer.start()

    async def _reload_tls(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.tls.reload_if_changed)

    async def _every(self, interval_ms: int, job) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await job()
            except Exception:
                logger.exception("background job %s failed", job.__name__)

    async def _retention(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.logs.delete_old_segments)

    async def _recheck_stalled(self) -> None:
        """Stalled connections learn of drained socket buffers here: the transport only
        reports draining below its low-water mark, not every byte its client reads."""
        for conn in list(self.stalled):
            conn.recheck()
        self.pool.wake_first()

    async def _close_stale_connections(self) -> None:
        now = time.monotonic()
        timeout = self.config.request_read_timeout_ms
        for conn in list(self.connections):
            if conn.overdue(now, timeout):
                logger.warning("%s: request not completed within %d ms of its first byte; closing", conn.peer, timeout)
                conn.close()
            elif not conn.busy and (now - conn.last_active) * 1000 > self.config.connections_max_idle_ms:
                logger.info("%s: idle for %d ms; closing", conn.peer, self.config.connections_max_idle_ms)
                conn.close()

    async def abort(self) -> None:
        """Undo a failed start: leave ZooKeeper, stop serving and replicating. The logs
        are left unmarked, so the next start recovers them: the start may have failed
        while loading them. Never raises over the start's own error."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.controller.stop)
            self.replicas.stop()
            await loop.run_in_executor(None, self.registry.stop)
        except Exception:
            logger.exception("broker %d: cleaning up after a failed start failed", self.config.broker_id)
        for server in self._servers:
            server.close()
        self.scheduler.shutdown()

    async def stop(self) -> None:
        """Deregister, stop serving, flush every log, mark the shutdown clean."""
        loop = asyncio.get_running_loop()
        self.handler.shutting_down = True
        for task in self._tasks:
            task.cancel()
        await self.kafka.groups.stop()
        await loop.run_in_executor(None, self.controller.stop)
        self.replicas.stop()
        await loop.run_in_executor(None, self.registry.stop)
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.close()
        await loop.run_in_executor(None, self.logs.close)
        self.scheduler.shutdown()
        logger.info("broker %d stopped cleanly", self.config.broker_id)


async def serve(config: BrokerConfig) -> None:
    """Run a broker until SIGTERM or SIGINT, then shut it down cleanly."""
    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # the start waits for ZooKeeper as long as it takes (registration retries through
    # an outage), so a signal must be able to end it
    starting = asyncio.ensure_future(broker.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            logger.info("signal received while starting; stopping")
            starting.cancel()
            await broker.abort()
            return
        starting.result()
    except BaseException:
        # a half-started broker must not stay registered in ZooKeeper, nor keep its
        # session's threads alive, after its event loop is gone
        await broker.abort()
        raise
    await stopping
    logger.info("signal received; shutting down")
    await broker.stop()
