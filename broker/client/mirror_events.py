"""The mirror's monitoring events (tier `mirror`, `broker.client.monitoring`): the
partitions' counters published into the target's monitoring topic without ever
holding up the copy or the checkpoints.

Why asynchronous (issue 33): the events went through a synchronous producer at every
checkpoint, so a monitoring topic without a reachable leader raised out of the
checkpoint and killed the mirror. Now `publish` sends and returns; an event that fails
(after the producer's own retries, within its delivery timeout) makes its window due
again (`MonitoringCounter.requeue`), so the next checkpoint sends its count of that
moment. A checkpoint may therefore hold counts not yet published: a restarted mirror
publishes every window its checkpoints restore (`MonitoringCounter.restore`).

What can never work is refused at start (`check_topic`): the monitoring topic missing
on a target that will not create it, or a principal that may not create it. A mirror
that copies the sources' monitoring topic too creates the target's as it creates every
target topic, with the sources' partition count; its events wait for that (`publish`
never lets the producer create the topic with the broker's `num.partitions` first).
"""

from __future__ import annotations

import logging
import threading
from typing import Iterable

from broker.client.cluster import ConnectionPool, ensure_topic
from broker.client.errors import MirrorRefused
from broker.client.metadata import ClusterMetadata
from broker.client.monitoring import MonitoringCounter
from broker.client.producer import Producer
from broker.client.results import RecordFuture
from broker.common.errors import AuthenticationError, AuthorizationFailed, LogbusError, TopicCreationDisabled

logger = logging.getLogger(__name__)


class MirrorEvents:
    """Publishes counters' events to `topic` of the target through an asynchronous,
    acks=-1 producer; used by the mirror's checkpoint thread only."""

    def __init__(self, metadata: ClusterMetadata, client_id: str, topic: str) -> None:
        self.topic = topic
        self._producer = Producer(metadata=metadata, mode="async", acks=-1, monitoring=False, linger_ms=0,
                                  client_id=client_id)
        self._in_flight: list[tuple[MonitoringCounter, bytes, RecordFuture]] = []
        self._waiting = False  # for the topic to exist: said once

    def check_topic(self, pool: ConnectionPool, stop: threading.Event, backoff: float, target: str) -> None:
        """Return once the monitoring topic exists on the target, created as a first
        produce would create it if missing; raise MirrorRefused naming the topic and
        the fix when the target refuses to create it; retry anything else (no broker
        reachable yet) every `backoff` seconds until `stop`."""
        while not stop.is_set():
            try:
                ensure_topic(pool.metadata, pool, self.topic)
                return
            except TopicCreationDisabled as exc:
                raise MirrorRefused(
                    f"the target cluster has no topic {self.topic!r} for the mirror's monitoring events and will not "
                    f"create it (auto.create.topics=false): create it there (logbus --zookeeper {target} topics "
                    f"create {self.topic} --partitions N), or set auto.create.topics=true on the target's brokers, "
                    "or run the mirror with --no-monitoring") from exc
            except (AuthorizationFailed, AuthenticationError) as exc:
                raise MirrorRefused(
                    f"the target cluster refuses to create topic {self.topic!r} for the mirror's monitoring events "
                    f"({type(exc).__name__}: {exc}): create it there, or grant the mirror's principal Create on it, "
                    "or run the mirror with --no-monitoring") from exc
            except (ConnectionError, OSError, LogbusError) as exc:
                logger.warning("cannot look up the monitoring topic %s on the target yet: %s; retrying", self.topic,
                               exc)
                stop.wait(backoff)

    def publish(self, counters: Iterable[MonitoringCounter]) -> None:
        """Send an event for every window whose count changed, without waiting; the
        windows of earlier events that failed meanwhile are sent again. Nothing is sent
        while the target has no such topic (the counts wait)."""
        self._settle()
        if not self._producer.metadata.partitions(self.topic):
            if not self._waiting:
                logger.warning("monitoring events wait for topic %s to exist in the target", self.topic)
            self._waiting = True
            return
        self._waiting = False
        for counter in counters:
            if counter.pending():
                for key, value in counter.events():
                    self._in_flight.append((counter, key, self._producer.send(self.topic, value, key=key)))

    def _settle(self) -> None:
        """Drop delivered events; make the windows of failed ones due again."""
        waiting, failed, error = [], {}, None
        for counter, key, future in self._in_flight:
            if not future.done():
                waiting.append((counter, key, future))
            elif (exc := future.exception(0)) is not None:
                if isinstance(exc, (AuthorizationFailed, AuthenticationError)):
                    raise MirrorRefused(f"the target refuses the mirror's monitoring events in {self.topic!r} "
                                        f"({type(exc).__name__}: {exc}): grant the mirror's principal Write on it, "
                                        "or run the mirror with --no-monitoring") from exc
                failed.setdefault(counter, []).append(key)
                error = exc
        self._in_flight = waiting
        for counter, keys in failed.items():
            counter.requeue(keys)
        if error is not None:
            logger.warning("%d monitoring events not published to %s (%s: %s); they go again",
                           sum(map(len, failed.values())), self.topic, type(error).__name__, error)

    def close(self, timeout: float) -> None:
        """Deliver what is in flight within `timeout` seconds. Whatever fails is in the
        checkpoints, which the next start publishes."""
        report = self._producer.close(timeout)
        if report.failed:
            logger.warning("%d monitoring events not published at close (%s): the mirror's next start publishes "
                           "them from its checkpoints", len(report.failed), report.failed[0].error)
