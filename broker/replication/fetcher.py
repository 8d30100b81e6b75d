"""A follower's side of one partition: truncate to where its log agrees with the new
leader's (KIP-101), then fetch the leader's bytes and append them unchanged, flushing
after every fetch that brought data, until the role changes.

The broker server never imports the client package, so the fetcher speaks the wire
protocol itself over one asyncio connection per followed partition (`LeaderLink`):
one request at a time, encoded and decoded by `broker.protocol`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from typing import Callable

from broker.config import BrokerConfig
from broker.errors import FencedLeaderEpoch, LogbusError, NotLeaderForPartition, OffsetOutOfRange
from broker.log.epochs import UNDEFINED
from broker.protocol import (
    BrokerInfo, LeaderEpochEndRequest, LeaderEpochEndResponse, Reader, ReplicaFetchRequest, ReplicaFetchResponse,
    decode_response_header, encode_request, raise_for_error,
)
from broker.replication.partition import Partition

logger = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
RETRY_SECONDS = 0.3


class LeaderLink:
    """One connection to the leader; requests one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str) -> None:
        self._reader, self._writer, self._client_id = reader, writer, client_id
        self._ids = itertools.count(1)

    @classmethod
    async def open(cls, leader: BrokerInfo, client_id: str, timeout: float) -> "LeaderLink":
        reader, writer = await asyncio.wait_for(asyncio.open_connection(leader.host, leader.port), timeout)
        return cls(reader, writer, client_id)

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


class ReplicaFetcher:
    def __init__(self, partition: Partition, leader: BrokerInfo, config: BrokerConfig, executor,
                 locate: Callable[[int], BrokerInfo | None]) -> None:
        self.partition = partition
        self.log = partition.log
        self.leader = leader
        self._locate = locate  # the leader's current address (it may restart elsewhere)
        self.epoch = partition.epoch
        self.config = config
        self._executor = executor
        self._pending_epochs: list[tuple[int, int]] = []  # the leader's (epoch, start) not yet reached
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    @property
    def _timeout(self) -> float:
        return self.config.replica_fetch_wait_max_ms / 1000 + self.config.request_read_timeout_ms / 1000

    async def _run(self) -> None:
        """Truncate on every new connection, not only on becoming a follower: a leader
        that restarted may have lost a tail this follower holds (the controller gives it
        a new epoch; checking again keeps the window small even when it does not)."""
        complaint = ""
        while True:
            link = None
            self.leader = self._locate(self.leader.broker_id) or self.leader
            try:
                link = await LeaderLink.open(self.leader, f"replica-{self.config.broker_id}", self._timeout)
                await self._truncate(link)
                while True:
                    await self._fetch_once(link)
                    complaint = ""
            except asyncio.CancelledError:
                raise
            except OffsetOutOfRange as exc:
                logger.warning("%s: %s; truncating again", self.log.name, exc)
            except (FencedLeaderEpoch, NotLeaderForPartition) as exc:
                complaint = self._complain(complaint, f"leader {self.leader.broker_id} answers: {exc}")
            except (OSError, EOFError, asyncio.TimeoutError, asyncio.IncompleteReadError, LogbusError) as exc:
                complaint = self._complain(complaint, f"fetching from broker {self.leader.broker_id} failed: {exc!r}")
            finally:
                if link is not None:
                    link.close()
            await asyncio.sleep(RETRY_SECONDS)

    def _complain(self, last: str, text: str) -> str:
        """Log a failure once, not on every retry."""
        if text != last:
            logger.warning("%s (epoch %d): %s; retrying", self.log.name, self.epoch, text)
        return text

    async def _leader_epoch_end(self, link: LeaderLink, epoch: int) -> tuple[int, int]:
        req = LeaderEpochEndRequest(self.log.topic, self.log.partition, epoch)
        answer = LeaderEpochEndResponse.decode(await link.request(req, self._timeout))
        return answer.epoch, answer.end_offset

    async def _truncate(self, link: LeaderLink) -> None:
        """KIP-101 (with KIP-279's repeat): cut the log where it stops agreeing with the
        leader's, found by leader epochs — never blindly at the high watermark. Then
        learn where the leader's newer epochs start, to record them as their bytes come."""
        log = self.log
        if (await self._leader_epoch_end(link, self.epoch))[0] != self.epoch:
            raise NotLeaderForPartition(f"broker {self.leader.broker_id} has not started epoch {self.epoch} yet")
        epoch = log.epochs.latest_epoch
        while True:
            leader_epoch, leader_end = await self._leader_epoch_end(link, epoch)
            if leader_epoch == UNDEFINED:
                target = min(log.end_offset, leader_end)
                break
            mine, my_end = log.epochs.end_offset_for(leader_epoch, log.end_offset)
            if mine == leader_epoch or mine == UNDEFINED:
                target = min(leader_end, my_end)
                break
            epoch = mine  # the leader never had my epoch: ask about the one before it
        if target < log.end_offset:
            logger.info("%s: truncating from %d to %d to follow broker %d in epoch %d (leader's epoch %d ends at %d)",
                        log.name, log.end_offset, target, self.leader.broker_id, self.epoch, leader_epoch, leader_end)
            await asyncio.get_running_loop().run_in_executor(self._executor, log.truncate_to, target)
        else:
            logger.info("%s: no truncation needed at %d to follow broker %d in epoch %d",
                        log.name, log.end_offset, self.leader.broker_id, self.epoch)
        pending = []
        epoch, mine = self.epoch, log.epochs.latest_epoch
        while epoch > mine:  # the leader's epochs newer than ours, newest first
            before, start = await self._leader_epoch_end(link, epoch - 1)
            pending.append((epoch, start))
            if before == UNDEFINED:
                break
            epoch = before
        self._pending_epochs = sorted(pending)

    async def _fetch_once(self, link: LeaderLink) -> None:
        log = self.log
        req = ReplicaFetchRequest(
            self.config.broker_id, self.epoch, log.topic, log.partition, log.end_offset, log.flushed_offset,
            self.config.replica_fetch_max_bytes, self.config.replica_fetch_wait_max_ms,
        )
        answer = ReplicaFetchResponse.decode(await link.request(req, self._timeout))
        if len(answer.messages):
            result = log.append_replica(answer.messages)
            if result.next_offset == result.base_offset and len(answer.messages) >= req.max_bytes:
                logger.error("%s: an entry at %d is larger than replica.fetch.max.bytes=%d; cannot replicate it",
                             log.name, log.end_offset, req.max_bytes)
            self._record_epochs(log.end_offset)
            await asyncio.get_running_loop().run_in_executor(self._executor, log.flush)
        log.high_watermark = min(answer.high_watermark, log.flushed_offset)

    def _record_epochs(self, end: int) -> None:
        while self._pending_epochs and self._pending_epochs[0][1] < end:
            log_epoch, start = self._pending_epochs.pop(0)
            self.log.epochs.assign(log_epoch, start)
