"""A follower's side of replication: one `SourceFetcher` per leader broker fetches every
partition this broker follows there, over one connection and one long poll (Kafka's
fetcher per source broker), so connections and idle polls grow with brokers, not with
partitions. Each partition (`FollowedPartition`) is first truncated to where its log
agrees with the leader's (KIP-101), then appended the leader's bytes unchanged and
flushed after every fetch that brought data, until its role changes.

The broker server never imports the client package, so the fetcher speaks the wire
protocol itself (`LeaderLink`): one request at a time, encoded and decoded by
`broker.common.protocol`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
import time
from typing import Callable

from broker.common.errors import ErrorCode, FencedLeaderEpoch, LogbusError, NotLeaderForPartition
from broker.common.protocol import (
    BrokerInfo, LeaderEpochEndRequest, LeaderEpochEndResponse, Reader, ReplicaFetchPartition, ReplicaFetchRequest,
    ReplicaFetchResponse, decode_replica_fetch, decode_response_header, encode_request, raise_for_error,
)
from broker.server.auth.interbroker import InterBrokerSecurity
from broker.server.config import BrokerConfig
from broker.server.log.epochs import UNDEFINED
from broker.server.replication.partition import Partition

logger = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
RETRY_SECONDS = 0.3


class LeaderLink:
    """One connection to the leader; requests one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str) -> None:
        self._reader, self._writer, self._client_id = reader, writer, client_id
        self._ids = itertools.count(1)

    @classmethod
    async def open(cls, leader: BrokerInfo, client_id: str, timeout: float,
                   security: InterBrokerSecurity) -> "LeaderLink":
        """Connect on the inter-broker listener, authenticating as it requires."""
        address = security.address(leader)
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(address.host, address.port, ssl=security.ssl_context), timeout)
        link = cls(reader, writer, client_id)
        try:
            await security.authenticate(lambda req: link.request(req, timeout))
        except BaseException:
            link.close()
            raise
        return link

    async def request(self, req, timeout: float) -> Reader:
        """Send `req`, return a reader at the body of its answer (errors raised)."""
        correlation_id = next(self._ids)
        self._writer.write(encode_request(req.API, correlation_id, self._client_id, req.encode()))
        await self._writer.drain()
        size = _SIZE.unpack(await asyncio.wait_for(self._reader.readexactly(4), timeout))[0]
        frame = await asyncio.wait_for(self._reader.readexactly(size), timeout)
        got, code, reader = decode_response_header(frame)
        if got != correlation_id:
            raise ConnectionError(f"answer {got} to request {correlation_id}")
        raise_for_error(code, reader)
        return reader

    def close(self) -> None:
        self._writer.close()


class FollowedPartition:
    """One partition a `SourceFetcher` follows, in the epoch it was told: whether it is
    truncated on the current connection, and the leader's newer epochs not yet reached.
    `active` turns false once the partition's role changes; whatever the fetcher is
    awaiting for it then is dropped, never applied."""

    def __init__(self, partition: Partition) -> None:
        self.partition = partition
        self.log = partition.log
        self.epoch = partition.epoch
        self.active = True
        self.truncated = False  # on the current connection
        self.retry_at = 0.0  # after a refusal: not before this (monotonic)
        self._pending_epochs: list[tuple[int, int]] = []  # the leader's (epoch, start) not yet reached
        self._complaint = ""
        self.sent: tuple[int, int] | None = None  # (log end, flushed end) in the last request

    @property
    def key(self) -> tuple[str, int]:
        return self.log.topic, self.log.partition

    @property
    def position(self) -> tuple[int, int]:
        return self.log.end_offset, self.log.flushed_offset

    def complain(self, text: str) -> None:
        """Log a refusal once, not on every retry; fetch it again a little later."""
        if text != self._complaint:
            logger.warning("%s (epoch %d): %s; retrying", self.log.name, self.epoch, text)
        self._complaint = text
        self.truncated = False  # truncate again before fetching: the leader may have moved on
        self.retry_at = time.monotonic() + RETRY_SECONDS

    def fetch(self, max_bytes: int) -> ReplicaFetchPartition:
        self.sent = self.position
        return ReplicaFetchPartition(self.log.topic, self.log.partition, self.epoch, *self.sent, max_bytes)

    async def truncate(self, link: LeaderLink, leader_id: int, executor, timeout: float) -> None:
        """KIP-101 (with KIP-279's repeat): cut the log where it stops agreeing with the
        leader's, found by leader epochs — never blindly at the high watermark. Then
        learn where the leader's newer epochs start, to record them as their bytes come."""
        log = self.log

        async def leader_epoch_end(epoch: int) -> tuple[int, int]:
            req = LeaderEpochEndRequest(log.topic, log.partition, epoch)
            answer = LeaderEpochEndResponse.decode(await link.request(req, timeout))
            return answer.epoch, answer.end_offset

        if (await leader_epoch_end(self.epoch))[0] != self.epoch:
            raise NotLeaderForPartition(f"broker {leader_id} has not started epoch {self.epoch} yet")
        epoch = log.epochs.latest_epoch
        while True:
            leader_epoch, leader_end = await leader_epoch_end(epoch)
            if leader_epoch == UNDEFINED:
                target = min(log.end_offset, leader_end)
                break
            mine, my_end = log.epochs.end_offset_for(leader_epoch, log.end_offset)
            if mine == leader_epoch or mine == UNDEFINED:
                target = min(leader_end, my_end)
                break
            epoch = mine  # the leader never had my epoch: ask about the one before it
        if not self.active:
            return  # no longer a follower of this leader: its log is not ours to cut
        if target < log.end_offset:
            logger.info("%s: truncating from %d to %d to follow broker %d in epoch %d (leader's epoch %d ends at %d)",
                        log.name, log.end_offset, target, leader_id, self.epoch, leader_epoch, leader_end)
            await asyncio.get_running_loop().run_in_executor(executor, log.truncate_to, target)
        else:
            logger.info("%s: no truncation needed at %d to follow broker %d in epoch %d",
                        log.name, log.end_offset, leader_id, self.epoch)
        pending = []
        epoch, mine = self.epoch, log.epochs.latest_epoch
        while epoch > mine:  # the leader's epochs newer than ours, newest first
            before, start = await leader_epoch_end(epoch - 1)
            pending.append((epoch, start))
            if before == UNDEFINED:
                break
            epoch = before
        self._pending_epochs = sorted(pending)
        self.truncated, self._complaint = True, ""

    def append(self, answer: ReplicaFetchResponse, max_bytes: int) -> bool:
        """Append what the leader sent (its bytes unchanged); True when there is
        something to flush."""
        log = self.log
        if not len(answer.messages):
            return False
        result = log.append_replica(answer.messages)
        if result.next_offset == result.base_offset and len(answer.messages) >= max_bytes:
            logger.error("%s: an entry at %d is larger than replica.fetch.max.bytes=%d; cannot replicate it",
                         log.name, log.end_offset, max_bytes)
        while self._pending_epochs and self._pending_epochs[0][1] < log.end_offset:
            log_epoch, start = self._pending_epochs.pop(0)
            log.epochs.assign(log_epoch, start)
        return True


class SourceFetcher:
    """Every partition this broker follows on one leader broker, fetched in one request
    per round. A refusal for one partition (the leader moved on, an offset out of
    range) sets that partition back to truncation and leaves the others fetching; a
    lost connection truncates them all again on the next one, because a leader that
    restarted may have lost a tail its followers hold."""

    def __init__(self, leader_id: int, config: BrokerConfig, executor,
                 locate: Callable[[int], BrokerInfo | None], security: InterBrokerSecurity) -> None:
        self.leader_id = leader_id
        self.security = security
        self.config = config
        self._executor = executor
        self._locate = locate  # the leader's current address (it may restart elsewhere)
        self._followed: dict[tuple[str, int], FollowedPartition] = {}
        self._session: set[tuple[str, int]] | None = None  # the partitions of the leader's fetch session
        self._task: asyncio.Task | None = None
        self._complaint = ""

    @property
    def idle(self) -> bool:
        return not self._followed

    def add(self, partition: Partition) -> None:
        """Follow `partition` in its current epoch; it joins the next round."""
        key = (partition.log.topic, partition.log.partition)
        self.remove(key)
        self._followed[key] = FollowedPartition(partition)
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def remove(self, key: tuple[str, int]) -> None:
        followed = self._followed.pop(key, None)
        if followed is not None:
            followed.active = False
        if not self._followed:
            self.stop()

    def stop(self) -> None:
        for followed in self._followed.values():
            followed.active = False
        self._followed.clear()
        if self._task is not None:
            self._task.cancel()
            self._task = None

    @property
    def _timeout(self) -> float:
        return self.config.replica_fetch_wait_max_ms / 1000 + self.config.request_read_timeout_ms / 1000

    async def _run(self) -> None:
        while True:
            link = None
            try:
                leader = self._locate(self.leader_id)
                if leader is None:
                    raise ConnectionError(f"broker {self.leader_id} is not registered")
                link = await LeaderLink.open(leader, f"replica-{self.config.broker_id}", self._timeout, self.security)
                self._session = None  # a new connection starts a new session
                for followed in self._followed.values():
                    followed.truncated = False
                while True:
                    await self._truncate(link)
                    ready = [f for f in self._followed.values() if f.truncated]
                    if ready:
                        await self._fetch_once(link, ready)
                        self._complaint = ""
                    else:
                        await asyncio.sleep(RETRY_SECONDS)
            except asyncio.CancelledError:
                raise
            except (OSError, EOFError, asyncio.TimeoutError, asyncio.IncompleteReadError, LogbusError) as exc:
                text = f"fetching from broker {self.leader_id} failed: {exc!r}"
                if text != self._complaint:
                    logger.warning("%s; retrying for %s", text, ", ".join(f.log.name for f in self._followed.values()))
                self._complaint = text
            finally:
                if link is not None:
                    link.close()
            await asyncio.sleep(RETRY_SECONDS)

    async def _truncate(self, link: LeaderLink) -> None:
        """Truncate every partition not yet truncated on this connection."""
        now = time.monotonic()
        for followed in list(self._followed.values()):
            if followed.truncated or followed.retry_at > now or not followed.active:
                continue
            try:
                await followed.truncate(link, self.leader_id, self._executor, self._timeout)
            except (NotLeaderForPartition, FencedLeaderEpoch) as exc:
                followed.complain(f"leader {self.leader_id} answers: {exc}")

    async def _fetch_once(self, link: LeaderLink, ready: list[FollowedPartition]) -> None:
        """One round of the fetch session: a full request when the partitions fetched
        changed (or on a new connection), else only those whose position moved; the
        answer names the partitions with bytes, an error or a new high watermark."""
        max_bytes = self.config.replica_fetch_max_bytes
        session = {f.key: f for f in ready}
        full = self._session != session.keys()
        named = ready if full else [f for f in ready if f.position != f.sent]
        req = ReplicaFetchRequest(self.config.broker_id, self.config.replica_fetch_wait_max_ms, full,
                                  tuple(f.fetch(max_bytes) for f in named))
        self._session = set(session)
        answer = decode_replica_fetch(await link.request(req, self._timeout))
        answered, appended = [], []
        for key, result in answer:
            followed = session.get(key)
            if followed is None or not followed.active:
                continue  # not fetched, or its role changed while the fetch was out: drop the answer
            if result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                logger.warning("%s: %s; truncating again", followed.log.name, result.message)
                followed.truncated = False
            elif result.error_code != ErrorCode.NONE:
                followed.complain(f"leader {self.leader_id} answers: {result.message}")
            else:
                answered.append((followed, result.value.high_watermark))
                if followed.append(result.value, max_bytes):
                    appended.append(followed.log)
        if appended:
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(self._executor, log.flush) for log in appended))
        for followed, high_watermark in answered:
            if followed.active:  # the HW never ahead of what is on this disk
                followed.log.high_watermark = min(high_watermark, followed.log.flushed_offset)
