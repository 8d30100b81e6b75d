"""What security costs (not a test): one broker of a secured cluster
(harness.secured), the same topic reached plaintext (the PLAIN listener, an ACL-less
super-user path is not used: PLAIN is anonymous, so the broker is run with
allow.everyone.if.no.acl.found) and over TLS (the MTLS listener, a client certificate),
alternating within each round so both see the same machine:

- the producer: `Producer.send` of 200-byte messages, batch 50, acks 1;
- the consumer: `SimpleConsumer` reading them back with 200 KB fetches (plaintext: the
  broker sends them with sendfile; TLS: through user space, encrypted);
- a new connection's SCRAM-SHA-256 handshake (TLS + SASL on the CLIENT listener),
  against a plain TCP connect + METADATA on PLAIN.

    .venv/bin/python -m bench.security --count 200000 --rounds 3

Prints the median of each and the ratios (issue 20's goal: TLS costs the producer at
most 30%).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from bench.replica_idle import cpu_seconds
from broker.client.connection import BrokerConnection
from broker.client.consumer import SimpleConsumer
from broker.client.producer import Producer
from broker.client.security import OPEN, ClientSecurity
from broker.common.zklayout import create_topic
from harness.secured import secured_cluster

SIZE = 200
FETCH = 200_000


def produce(zk: str, topic: str, count: int, security: ClientSecurity) -> float:
    value = b"x" * SIZE
    # idempotence off: plain batches of 50 (~11 KB entries) that 200 KB fetches can read
    with Producer(zookeeper=zk, mode="async", acks=1, batch_size=50, linger_ms=5, monitoring=False,
                  queue_size=50_000, enable_idempotence=False, security=security) as producer:
        producer.send(topic, value, partition=0).result(30)
        start = time.perf_counter()
        for _ in range(count):
            producer.send(topic, value, partition=0)
        report = producer.flush(600)
        elapsed = time.perf_counter() - start
    assert report.ok, report
    return count / elapsed


def consume(zk: str, topic: str, count: int, security: ClientSecurity) -> float:
    with SimpleConsumer(topic, 0, zk, offset="smallest", fetch_size=FETCH, max_fetch_size=FETCH, max_wait_ms=100,
                        security=security) as consumer:
        got, start = 0, time.perf_counter()
        while got < count:
            got += len(consumer.fetch_columns())
        return got / (time.perf_counter() - start)


def handshakes(address: tuple[str, int], security: ClientSecurity, n: int) -> float:
    """Median milliseconds from connect to a first METADATA answer."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        with BrokerConnection(*address, security=security) as conn:
            conn.metadata([])
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--handshakes", type=int, default=50)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rates: dict[tuple[str, str], list[float]] = {}
    with secured_cluster(1, settings={"allow.everyone.if.no.acl.found": "true", "log.flush.interval.ms": 200,
                                      "log.flush.interval.messages": 100_000}) as secured:
        zk = secured.connect_string
        plain = ClientSecurity(listener="PLAIN")
        tls = secured.certificate("bench", "MTLS")
        broker_pid = secured.cluster.brokers[0].process.pid
        for round_ in range(args.rounds):
            for name, security in ((("plaintext", plain), ("tls", tls)) if round_ % 2 == 0
                                   else (("tls", tls), ("plaintext", plain))):
                topic = f"bench-r{round_}-{name}"
                create_topic(secured.admin_zk, topic, 1)
                rates.setdefault(("produce", name), []).append(produce(zk, topic, args.count, security))
                before = cpu_seconds(broker_pid)
                rates.setdefault(("consume", name), []).append(consume(zk, topic, args.count, security))
                rates.setdefault(("broker cpu", name), []).append((cpu_seconds(broker_pid) - before) * 1e6 / args.count)
        connect_plain = handshakes(secured.address(0, "PLAIN"), OPEN, args.handshakes)
        connect_tls = handshakes(secured.address(0, "MTLS"), tls, args.handshakes)
        connect_scram = handshakes(secured.address(0, "CLIENT"), secured.scram("admin", "admin-secret"),
                                   args.handshakes)
    print(f"{args.count} messages of {SIZE} bytes per run, {args.rounds} rounds, one broker, one partition")
    print(f"{'':10} {'plaintext msg/s':>16} {'TLS msg/s':>10} {'TLS/plain':>9}")
    for what in ("produce", "consume"):
        p, t = statistics.median(rates[(what, "plaintext")]), statistics.median(rates[(what, "tls")])
        print(f"{what:10} {p:16,.0f} {t:10,.0f} {t / p:9.2f}")
    p, t = statistics.median(rates[("broker cpu", "plaintext")]), statistics.median(rates[("broker cpu", "tls")])
    print(f"the broker's CPU per message read (µs): plaintext (sendfile) {p:.2f}, TLS {t:.2f}")
    print(f"new connection to a first METADATA answer, median of {args.handshakes}: plaintext "
          f"{connect_plain:.2f} ms, TLS (client certificate) {connect_tls:.2f} ms, TLS + SCRAM-SHA-256 "
          f"{connect_scram:.2f} ms")


if __name__ == "__main__":
    main()
