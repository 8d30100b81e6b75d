"""logbus in the paper's experiments, through the real client library
(`broker.client.producer.Producer`, `broker.client.consumer.SimpleConsumer`).

One ZooKeeper and one broker (started with `harness.zookeeper` and `harness.cluster`) in a scratch
directory; one partition per topic, one producer, one consumer.
"""

from __future__ import annotations

import multiprocessing
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from broker.client.connection import BrokerConnection
from broker.client.consumer import SimpleConsumer
from broker.client.producer import Producer
from broker.common.message import HEADER_SIZE
from harness.cluster import BrokerProcess, LocalCluster
from harness.process import wait_until
from harness.zookeeper import ZooKeeperServer
from bench.peers.base import settled_disk_bytes

# Throughput runs: the flush policy bench/raw.py uses (fsync every 50,000 messages or 1 s).
THROUGHPUT_SETTINGS = {"log.flush.interval.messages": 50_000, "log.flush.interval.ms": 1000}
QUEUE_SIZE = 10_000


@dataclass
class LogbusSetup:
    zk: ZooKeeperServer
    cluster: LocalCluster
    broker: BrokerProcess

    @property
    def zookeeper(self) -> str:
        return self.cluster.zookeeper

    def topic_dir(self, topic: str) -> Path:
        return self.broker.log_dir / f"{topic}-0"

    def pid(self) -> int:
        return self.broker.process.pid


def create_topic(setup: LogbusSetup, topic: str) -> None:
    with BrokerConnection(*setup.broker.address, client_id="paper-bench") as conn:
        conn.create_topic(topic, 1)
    wait_until(lambda: setup.topic_dir(topic).exists(), 30, f"log directory of {topic}")


def wait_visible(setup: LogbusSetup, topic: str, end_offset: int, timeout: float = 120) -> None:
    """Wait until the broker has flushed (made visible) everything up to `end_offset`."""
    with BrokerConnection(*setup.broker.address, client_id="paper-bench") as conn:
        wait_until(lambda: conn.offsets(topic, 0, -1)[0] >= end_offset, timeout, f"{topic} flushed to {end_offset}")


def produce(setup: LogbusSetup, topic: str, messages: int, payload: bytes, sampler, *, acks: int, batch: int,
            linger_ms: int = 5, queue_size: int = QUEUE_SIZE, idempotent: bool = False, whole_batches: bool = False) -> int:
    """One async producer sends `messages`. Samples count messages *delivered* (the
    producer's `on_delivery`: acks=0 written to the socket, acks=1 answered), not
    calls to `send`, which only fill the producer's queue; the clock stops when
    `flush()` returns. Returns the topic's expected end offset.

    Messages go through `Producer.produce`, without a future: the paper's producer
    (Kafka 0.7's async `send`) gives nothing back either. `idempotent=False` is the
    paper's producer: each batch of `batch` messages one request. The idempotent producer (the default of `Producer`) merges batches queued
    behind its five in flight per partition, so at batch 1 it is no longer one message
    a request: `make bench` reports it as a row of its own.

    `whole_batches`: the caller hands `batch` messages to one `send_many`, as the paper's
    own tool did — Kafka 0.7's `kafka.perf.ProducerPerformance`, by default synchronous,
    passes `--batch-size` messages to one `producer.send` (a `ProducerData` holding a
    list), which is one request. Per message (the default) is a web server's producer."""
    delivered = 0
    every = sampler.every

    def on_delivery(b) -> None:  # in the producer's sender thread
        nonlocal delivered
        delivered += b.count
        while delivered - sampler.done >= every:
            sampler.tick(every)

    # queue.size 10,000: Kafka 0.7's async producer default (ours is 100,000); with it a
    # sender round delivers at most 2 MB, so samples every 10 MB are not bunched up.
    producer = Producer(zookeeper=setup.zookeeper, acks=acks, mode="async", batch_size=batch, linger_ms=linger_ms,
                        queue_size=queue_size, monitoring=False, client_id="paper-bench-producer",
                        enable_idempotence=idempotent,
                        on_delivery=on_delivery)
    try:
        produce, send_many, values = producer.produce, producer.send_many, [payload] * batch
        sampler.start()
        if whole_batches:
            for _ in range(messages // batch):
                send_many(topic, values)
            for _ in range(messages % batch):
                produce(topic, payload)
        else:
            for _ in range(messages):
                produce(topic, payload)
        report = producer.flush(600)
        sampler.tick(delivered - sampler.done)
        sampler.finish()
        if not report.ok:
            raise RuntimeError(f"logbus producer: {report}")
    finally:
        producer.close(30)
    return messages * (HEADER_SIZE + len(payload))


def consume(setup: LogbusSetup, topic: str, messages: int, sampler, fetch_size: int = 200 * 1024) -> int:
    """One SimpleConsumer reads the topic from the start: fetches of `fetch_size`
    bytes (about 1,000 messages of 200 bytes), CRCs checked."""
    got = 0
    with SimpleConsumer(topic, 0, zookeeper=setup.zookeeper, offset="smallest", fetch_size=fetch_size,
                        max_wait_ms=100, client_id="paper-bench-consumer") as consumer:
        every = sampler.every
        pending = 0
        empty = 0
        sampler.start()
        while got < messages and empty < 50:
            batch = consumer.fetch()
            if not batch:
                empty += 1
                continue
            empty = 0
            n = len(batch)
            got += n
            pending += n
            while pending >= every:
                sampler.tick(every)
                pending -= every
        sampler.tick(pending)
        sampler.finish()
    return got


def storage_overhead(setup: LogbusSetup, topic: str, messages: int, payload_bytes: int) -> tuple[int, float]:
    """(bytes on disk, bytes per message beyond the payload) of a topic holding `messages`."""
    used = settled_disk_bytes(setup.topic_dir(topic), timeout=10)
    return used, used / messages - payload_bytes


# ----------------------------------------------------------------------- latency

_STAMP = struct.Struct(">q")


def _latency_consumer(zookeeper: str, topic: str, messages: int, deadline: float, out) -> None:
    lat: list[float] = []
    with SimpleConsumer(topic, 0, zookeeper=zookeeper, offset="smallest", fetch_size=200 * 1024, max_wait_ms=500,
                        client_id="paper-latency-consumer") as consumer:
        out.send("ready")
        while len(lat) < messages and time.time() < deadline:
            batch = consumer.fetch()
            now = time.time_ns()
            for m in batch:
                lat.append((now - _STAMP.unpack_from(m.value)[0]) / 1e6)
    out.send(lat)
    out.close()


def latency(setup: LogbusSetup, topic: str, rate: int, seconds: float, payload_bytes: int = 200,
            acks: int = 1, batch: int = 50, linger_ms: int = 5) -> list[float]:
    """End-to-end latency in ms (send() called → message returned by a consumer's
    fetch, in another process) of `rate` messages/s for `seconds`."""
    messages = int(rate * seconds)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_latency_consumer,
                       args=(setup.zookeeper, topic, messages, time.time() + seconds + 60, child), daemon=True)
    proc.start()
    try:
        if not parent.poll(60) or parent.recv() != "ready":
            raise RuntimeError("latency consumer did not start")
        pad = b"p" * (payload_bytes - _STAMP.size)
        producer = Producer(zookeeper=setup.zookeeper, acks=acks, mode="async", batch_size=batch,
                            linger_ms=linger_ms, monitoring=False, client_id="paper-latency-producer",
                            enable_idempotence=acks != 0)
        try:
            start = time.perf_counter()
            for i in range(messages):
                due = start + i / rate
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                producer.send(topic, _STAMP.pack(time.time_ns()) + pad)
                if i % rate == 0:
                    sys.stderr.write(f"\r  latency at {rate:,} msg/s: {i:>7,}/{messages:,} sent   ")
            producer.flush(60)
        finally:
            producer.close(30)
        sys.stderr.write("\n")
        if not parent.poll(seconds + 90):
            raise RuntimeError("latency consumer did not answer")
        return parent.recv()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
