"""Kafka's Fetch on the Kafka listener (docs/kafka.md, "Fetch"): for each partition, the
entries from the one holding the fetch offset, as Kafka record batches — a stored Kafka
batch as it was produced (its 22-byte logbus header cut off), a run of native entries
converted (`broker.common.kafka.fetch.fetch_batches`). Batches are whole: a batch larger
than what the request allows is still sent alone when it is the first (KIP-74), so a
consumer always progresses. Records below the fetch offset inside the first batch are
the client's to skip, as with Kafka.

Long poll: with less than `min_bytes` ready the answer waits, up to `max_wait` (at most
`fetch.max.wait.ms`), for any partition's visible end to move past where its read
starts. Only read_uncommitted exists (logbus has no transactions), so the last stable
offset is the high watermark. Fetch sessions (KIP-227) are not kept: every request is a
full fetch, session id 0, which clients accept.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode as KafkaError

from broker.common.acls import Operation
from broker.common.errors import LogbusError
from broker.common.kafka.apis import ApiKey
from broker.common.kafka.errors import kafka_error
from broker.common.kafka.fetch import fetch_batches
from broker.common.message import first_entry_size
from broker.server.auth.session import Session
from broker.server.handlers import RequestHandler
from broker.server.kafka.messages import NO_THROTTLE, entity, response
from broker.server.kafka.positions import kafka_end
from broker.server.log.log import Log
from broker.server.replies import Reply, answered, later



class PartitionRead(NamedTuple):
    topic: str
    partition: int
    log: Log | None  # None: refused
    start: int  # where the read starts (the entry holding the fetch offset)
    batches: bytes
    error: KafkaError


class FetchRequests:
    def __init__(self, native: RequestHandler) -> None:
        self.native = native

    def fetch(self, request: Any, version: int, session: Session) -> Reply:
        reads = self._read_all(request, session)
        ready = sum(len(r.batches) for r in reads)
        wait_ms = request.max_wait.total_seconds() * 1000
        if ready >= max(request.min_bytes, 1) or wait_ms <= 0 or not any(r.log for r in reads):
            return answered(self._response(version, reads))
        return later(self._fetch_later(request, version, session, reads, wait_ms))

    async def _fetch_later(self, request: Any, version: int, session: Session, reads: list[PartitionRead],
                           wait_ms: float) -> Any:
        waits = [(r.log, r.start, 1) for r in reads if r.log is not None]
        seconds = min(wait_ms, self.native.config.fetch_max_wait_ms) / 1000
        await self.native.scheduler.wait_for_data(waits, seconds)
        return self._response(version, self._read_all(request, session))

    def _read_all(self, request: Any, session: Session) -> list[PartitionRead]:
        budget = whole = request.max_bytes if request.max_bytes > 0 else 1 << 30
        reads = []
        for topic in request.topics:
            refusal = self.native.rules.topic_refusal(session, Operation.READ, topic.topic)
            for part in topic.partitions:
                read = self._read(topic.topic, part, min(budget, part.partition_max_bytes), refusal,
                                  first=budget == whole)  # nothing read yet: KIP-74 applies
                budget -= len(read.batches)
                reads.append(read)
        return reads

    def _read(self, topic: str, part: Any, max_bytes: int, refusal: Exception | None, first: bool) -> PartitionRead:
        try:
            if refusal is not None:
                raise refusal
            log = self.native.leader_log(topic, part.partition)
            start, region = log.read_covering(part.fetch_offset, max(max_bytes, 0))
            data = region.read()
            batches = fetch_batches(data, start)
            if not batches and first and data:  # one entry larger than max_bytes: sent whole (KIP-74)
                size = first_entry_size(data)
                if size is not None and size > len(data):
                    data = log.read(start, size, exact=True).read()
                    batches = fetch_batches(data, start)
            return PartitionRead(topic, part.partition, log, start, b"".join(batches), KafkaError.none)
        except LogbusError as exc:
            return PartitionRead(topic, part.partition, None, -1, b"", kafka_error(exc.code))

    @staticmethod
    def _response(version: int, reads: list[PartitionRead]) -> Any:
        by_topic: dict[str, list] = {}
        for read in reads:
            if read.log is not None:
                end, start = kafka_end(read.log), read.log.start_offset
            else:
                end = start = -1
            by_topic.setdefault(read.topic, []).append(entity(
                ApiKey.FETCH, version, "PartitionData", partition_index=read.partition, error_code=read.error,
                high_watermark=end, last_stable_offset=end, log_start_offset=start, aborted_transactions=None,
                preferred_read_replica=-1, records=read.batches))
        topics = tuple(entity(ApiKey.FETCH, version, "FetchableTopicResponse", topic=t, partitions=tuple(p))
                       for t, p in by_topic.items())
        return response(ApiKey.FETCH, version, throttle_time=NO_THROTTLE, error_code=KafkaError.none, session_id=0,
                        responses=topics)
