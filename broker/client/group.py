"""Consumer groups (docs/clients.md, docs/zookeeper.md):
`ConsumerGroup(group, {topic: n_streams}, zookeeper=...)`.

Each consumer registers `/consumers/<g>/ids/<id>` (ephemeral, JSON {topic: streams})
and watches the group's consumers, the live brokers and its topics' assignments. On any
change it rebalances (the paper's Algorithm 1, `broker.client.rebalance`):

1. stop handing out fetched messages (the generation moves on) and stop fetching;
2. commit the offsets of what it handed out, release every ownership node it holds;
3. compute its partitions from the registry, claim each with an ephemeral
   `/consumers/<g>/owners/<t>/<p>` node; if one is still held by another consumer
   (which has not rebalanced yet) release everything, back off and retry
   (`rebalance_max_retries` times, then wait for the next change or a periodic retry);
4. read the committed offsets (`/consumers/<g>/offsets/<t>/<p>`, the next offset to
   read) — a partition without one starts at `auto_offset_reset` — and fetch again.

A partition is thus read by exactly one consumer of a group (point to point), and
every group reads every message (publish/subscribe across groups). Delivery is
at-least-once: after a crash the successor resumes at the last committed offset, so the
messages handed out since are delivered again. Offsets are committed every
`auto_commit_interval_ms` (0: never automatically), on `commit()`, at every
rebalance and on `close()`. The committed offset is the `next_offset` of the last
message handed out — for compressed sets a wrapper boundary.

`streams` is {topic: [MessageStream]}; a stream blocks until data arrives. With
`consumer_timeout_ms` its iteration raises `ConsumerTimeout` after that long without a
message (iterate again to go on); `close()` ends every stream's iteration.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid

from kazoo.client import KazooState
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch

from broker.client.metadata import ZooKeeperMetadata, connect_zookeeper
from broker.client.fetcher import Fetcher, PartitionFetch
from broker.client.rebalance import Subscriptions, assignment_for, stream_id
from broker.client.security import OPEN, ClientSecurity
from broker.client.settings import require_at_least
from broker.client.stream import CLOSED, Chunk, MessageStream
from broker.common.protocol import check_topic_name
from broker.common.zklayout import (
    consumer_path, decode_subscription, encode_subscription, group_ids_path, owner_path, read_offset, write_offset,
)

logger = logging.getLogger(__name__)

Owned = dict[tuple[str, int], str]  # (topic, partition) -> stream id


class ConsumerGroup:
    """One member of a consumer group. `_lock` guards `_generation`, `_owned`,
    `_consumed` and `_committed`: the streams record consumed offsets while the
    coordinator thread rebalances and commits."""

    def __init__(
        self,
        group: str,
        topics: dict[str, int],
        zookeeper: str,
        *,
        auto_offset_reset: str = "smallest",
        auto_commit_interval_ms: int = 5_000,
        consumer_id: str | None = None,
        consumer_timeout_ms: int | None = None,
        fetch_size: int = 1 << 20,
        max_fetch_size: int = 64 << 20,
        max_wait_ms: int = 500,
        queued_chunks: int = 4,
        rebalance_max_retries: int = 10,
        rebalance_backoff_ms: int = 200,
        zookeeper_session_timeout_ms: int = 6_000,
        zookeeper_timeout: float = 10.0,
        security: ClientSecurity = OPEN,
    ) -> None:
        if auto_offset_reset not in ("smallest", "largest", "error"):
            raise ValueError(f"auto_offset_reset must be smallest, largest or error, not {auto_offset_reset!r}")
        if not group or "/" in group:
            raise ValueError(f"invalid group name {group!r}")
        for topic in topics:
            check_topic_name(topic)
        require_at_least(locals(), {"auto_commit_interval_ms": 0, "consumer_timeout_ms": 0, "fetch_size": 1,
                                    "max_fetch_size": 1, "max_wait_ms": 0, "queued_chunks": 1,
                                    "rebalance_max_retries": 0, "rebalance_backoff_ms": 0,
                                    "zookeeper_session_timeout_ms": 1})
        self.group = group
        self.topics = {t: int(n) for t, n in topics.items() if int(n) > 0}
        self.consumer_id = consumer_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self.auto_offset_reset = auto_offset_reset
        self.auto_commit_interval = auto_commit_interval_ms / 1000
        self.rebalance_max_retries = rebalance_max_retries
        self.rebalance_backoff = rebalance_backoff_ms / 1000
        self.zk = connect_zookeeper(zookeeper, zookeeper_timeout, zookeeper_session_timeout_ms / 1000,
                                    auth=security.zookeeper())
        self.metadata = ZooKeeperMetadata(self.zk, security=security)
        timeout = None if consumer_timeout_ms is None else consumer_timeout_ms / 1000
        self.streams: dict[str, list[MessageStream]] = {
            t: [MessageStream(stream_id(self.consumer_id, t, i), t, self._hand_out, timeout, self._stream_took)
                for i in range(n)]
            for t, n in self.topics.items()
        }
        self._by_id = {s.stream_id: s for streams in self.streams.values() for s in streams}
        self._lock = threading.Lock()
        self._generation = 0
        self._owned: Owned = {}
        self._consumed: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self.rebalances = 0  # completed rebalances, for tests and monitoring
        self._changed = threading.Event()
        self._session_lost = False
        self._closed = threading.Event()
        self.fetcher = Fetcher(
            self.metadata, self.consumer_id, fetch_size=fetch_size, max_fetch_size=max_fetch_size,
            max_wait_ms=max_wait_ms, auto_offset_reset=auto_offset_reset, queued_chunks=queued_chunks,
        )
        self._register()
        self.zk.add_listener(self._on_state)
        for topic in self.topics:
            self.metadata.partitions(topic)  # start watching its assignment
        self.metadata.add_listener(self._changed.set)
        ChildrenWatch(self.zk, group_ids_path(group), self._on_members)
        self.fetcher.start()
        self._coordinator = threading.Thread(target=self._coordinate, name=f"{self.consumer_id}-coordinator",
                                             daemon=True)
        self._coordinator.start()

    def __enter__(self) -> "ConsumerGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- registration

    def _register(self) -> None:
        path = consumer_path(self.group, self.consumer_id)
        data = encode_subscription(self.topics)
        try:
            self.zk.create(path, data, ephemeral=True, makepath=True)
        except NodeExistsError:
            _, stat = self.zk.get(path)
            if stat.ephemeralOwner != self.zk.client_id[0]:
                raise ValueError(f"consumer id {self.consumer_id!r} is already registered in group {self.group!r}")

    def _on_members(self, children: list[str]) -> bool | None:
        if self._closed.is_set():
            return False
        self._changed.set()
        return None

    def _on_state(self, state: str) -> None:
        """A lost session took our ephemeral nodes: register again and rebalance once
        connected (in the coordinator thread; kazoo's thread must not block)."""
        if state == KazooState.LOST:
            self._session_lost = True
        elif state == KazooState.CONNECTED and self._session_lost:
            self._changed.set()

    # ------------------------------------------------------------------ coordinator

    def _coordinate(self) -> None:
        next_commit = time.monotonic() + self.auto_commit_interval
        retry_at = None
        while not self._closed.is_set():
            now = time.monotonic()
            timeouts = [1.0]
            if self.auto_commit_interval > 0:
                timeouts.append(next_commit - now)
            if retry_at is not None:
                timeouts.append(retry_at - now)
            if self._changed.wait(max(0.0, min(timeouts))) or (retry_at is not None and time.monotonic() >= retry_at):
                if self._closed.is_set():
                    return
                time.sleep(0.02)  # let a burst of watch events settle into one rebalance
                self._changed.clear()
                try:
                    if self._session_lost:
                        self._session_lost = False
                        self._register()
                    retry_at = None if self._rebalance() else time.monotonic() + 10 * self.rebalance_backoff
                except Exception:
                    logger.exception("rebalance of group %s failed; retrying", self.group)
                    retry_at = time.monotonic() + self.rebalance_backoff
            if self.auto_commit_interval > 0 and time.monotonic() >= next_commit:
                self._safe_commit()
                next_commit = time.monotonic() + self.auto_commit_interval

    def _safe_commit(self) -> None:
        try:
            self.commit()
        except Exception as exc:
            logger.warning("offset commit of group %s failed: %s", self.group, exc)

    def _rebalance(self) -> bool:
        for attempt in range(self.rebalance_max_retries):
            if self._closed.is_set():
                return True
            self._stop_fetching()
            self._safe_commit()
            self._release()
            subscriptions = self._subscriptions()
            partitions = {t: sorted(leaders) for t in self.topics if (leaders := self.metadata.partitions(t))}
            wanted = assignment_for(self.consumer_id, subscriptions, partitions)
            if self._claim(wanted):
                self._start_fetching(wanted)
                self.rebalances += 1
                logger.info("consumer %s of group %s owns %s", self.consumer_id, self.group,
                            sorted(f"{t}-{p}" for t, p in wanted))
                return True
            self._release()
            self._changed.clear()
            logger.info("consumer %s: partitions still owned by others; retry %d", self.consumer_id, attempt + 1)
            time.sleep(self.rebalance_backoff * (attempt + 1))
        logger.error("consumer %s of group %s could not rebalance after %d attempts; will try again",
                     self.consumer_id, self.group, self.rebalance_max_retries)
        return False

    def _subscriptions(self) -> Subscriptions:
        subscriptions: Subscriptions = {}
        path = group_ids_path(self.group)
        for child in self.zk.get_children(path):
            try:
                subscriptions[child] = decode_subscription(self.zk.get(consumer_path(self.group, child))[0])
            except (NoNodeError, ValueError, AttributeError):
                continue
        return subscriptions

    def _claim(self, wanted: Owned) -> bool:
        claimed: Owned = {}
        for (topic, partition), stream in sorted(wanted.items()):
            path = owner_path(self.group, topic, partition)
            try:
                self.zk.create(path, stream.encode(), ephemeral=True, makepath=True)
            except NodeExistsError:
                try:
                    data, stat = self.zk.get(path)
                except NoNodeError:
                    return self._claimed(claimed, False)
                if stat.ephemeralOwner != self.zk.client_id[0]:
                    return self._claimed(claimed, False)
                if data.decode() != stream:
                    self.zk.set(path, stream.encode())
            claimed[(topic, partition)] = stream
        return self._claimed(claimed, True)

    def _claimed(self, claimed: Owned, ok: bool) -> bool:
        with self._lock:
            self._owned = claimed
        return ok

    def _release(self) -> None:
        with self._lock:
            owned, self._owned = self._owned, {}
        for topic, partition in owned:
            try:
                self.zk.delete(owner_path(self.group, topic, partition))
            except NoNodeError:
                pass

    def _stop_fetching(self) -> None:
        with self._lock:
            self._generation += 1
            generation = self._generation
        self.fetcher.assign([], generation)
        for stream in self._by_id.values():
            stream.clear()

    def _start_fetching(self, owned: Owned) -> None:
        work = []
        for (topic, partition), sid in sorted(owned.items()):
            offset = read_offset(self.zk, self.group, topic, partition)
            work.append(PartitionFetch(topic, partition, self._by_id[sid], offset, self.fetcher.fetch_size))
        with self._lock:
            self._consumed = {(f.topic, f.partition): f.offset for f in work if f.offset is not None}
            self._committed = dict(self._consumed)
            generation = self._generation
        self.fetcher.assign(work, generation)

    # ------------------------------------------------------------------- streams

    def _hand_out(self, chunk: Chunk, next_offset: int) -> bool:
        with self._lock:
            if chunk.generation != self._generation:
                return False
            self._consumed[(chunk.topic, chunk.partition)] = next_offset
            return True

    def _stream_took(self) -> None:
        self.fetcher.wake.set()

    # ------------------------------------------------------------------ public API

    def owned(self) -> Owned:
        """{(topic, partition): stream id} this consumer owns now."""
        with self._lock:
            return dict(self._owned)

    def commit(self) -> None:
        """Write the offsets of what was handed out since the last commit."""
        with self._lock:
            todo = {k: v for k, v in self._consumed.items() if self._committed.get(k) != v and k in self._owned}
        for (topic, partition), offset in todo.items():
            write_offset(self.zk, self.group, topic, partition, offset)
        with self._lock:
            self._committed.update(todo)

    def close(self) -> None:
        """Commit, release ownership, leave the group (the others rebalance), end the
        streams' iteration."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._changed.set()
        self._coordinator.join(30)
        try:
            self._safe_commit()
            self._stop_fetching()
            self._release()
            try:
                self.zk.delete(f"{group_ids_path(self.group)}/{self.consumer_id}")
            except NoNodeError:
                pass
        except Exception as exc:
            logger.warning("consumer %s could not leave group %s cleanly: %s", self.consumer_id, self.group, exc)
        finally:
            self.fetcher.stop()
            self.fetcher.join(5)
            for stream in self._by_id.values():
                stream.queue.put(CLOSED)
            self.metadata.close()
            try:
                self.zk.stop()
                self.zk.close()
            except Exception:
                pass
