"""`logbus mirror` with events stamped 30 hours in the past (issue 33): a backfill or a
replay keeps its event times through the mirror, and the target must still drop the
batches a restarted mirror re-sends. Two single-broker source clusters, an RF 3 target
that runs a retention check every second, the mirror killed with SIGKILL at random
(seeded) moments, a target leader killed -9 and a target broker restarted under it:
every message is in the target once, in order per source partition. Real ZooKeeper,
brokers and `logbus mirror` processes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from broker.client.consumer import SimpleConsumer
from broker.client.metadata import open_metadata
from broker.client.producer import Producer
from broker.common.errors import LogbusError
from broker.common.message import now_ms
from broker.common.zklayout import create_topic
from harness.cluster import LocalCluster
from harness.process import wait_until
from harness.zookeeper import client, with_chroot
from tests.integration.clientutil import read_topic
from tests.replication.replicated import BROKER_SETTINGS, create_replicated_topic, state, wait_for_state

TOPIC = "events"
PARTITIONS = 2
SOURCES = ("east", "west")
EVENT_AGE_MS = 30 * 3600 * 1000  # older than producer.id.expiration.ms's default, one day
LIMIT = 1500  # messages per source partition: a few thousand in all at most
TARGET_SETTINGS = {
    **BROKER_SETTINGS,
    "default.replication.factor": 3,  # the monitoring topic the mirror writes too
    # each check used to forget every producer id whose messages were stamped over a day ago
    "log.retention.check.interval.ms": 1000,
}


@pytest.fixture
def clusters(zk_connect, tmp_path):
    """{name: (connect string, LocalCluster)}: sources "east" and "west" (one broker
    each) and the "offline" target (three brokers)."""
    out = {}
    try:
        for name, brokers in (("east", 1), ("west", 1), ("offline", 3)):
            connect = with_chroot(zk_connect, f"/{name}")
            out[name] = (connect, LocalCluster(connect, tmp_path / name, settings={"log.flush.interval.ms": 20}))
            for broker_id in range(brokers):
                out[name][1].start_broker(broker_id, TARGET_SETTINGS if name == "offline" else None)
        yield out
    finally:
        for _, cluster in out.values():
            cluster.stop()


class OldEventProducer(threading.Thread):
    """Writes `name:partition:seq` values stamped 30 h ago to both partitions of a
    source, paced, until stopped or `LIMIT` per partition are sent."""

    def __init__(self, name: str, connect: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.name, self.connect, self.stop_event = name, connect, stop
        self.sent: dict[int, int] = defaultdict(int)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Producer(zookeeper=self.connect, mode="async", acks=-1, monitoring=False, linger_ms=5) as producer:
                while not self.stop_event.is_set() and min(self.sent[p] for p in range(PARTITIONS)) < LIMIT:
                    for partition in range(PARTITIONS):
                        futures = []
                        for _ in range(5):
                            value = b"%s:%d:%d" % (self.name.encode(), partition, self.sent[partition])
                            futures.append(producer.send(TOPIC, value, timestamp=now_ms() - EVENT_AGE_MS,
                                                         partition=partition))
                            self.sent[partition] += 1
                        for future in futures:
                            future.result(60)
                    self.stop_event.wait(0.25)
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc


class MirrorService:
    """`logbus mirror` as a service manager runs it: started, killed, and restarted
    when it exits on its own (counted in `exits`)."""

    def __init__(self, target: str, sources: dict[str, str], log: Path) -> None:
        self.args = [sys.executable, "-c", "import sys; from broker.tools.cli import main; sys.exit(main())",
                     "--zookeeper", target, "--log-level", "INFO", "mirror", "--name", "dc", "--topics", TOPIC,
                     "--report-interval", "0"]
        for name, connect in sources.items():
            self.args += ["--source", f"{name}={connect}"]
        self.log = log
        self.process: subprocess.Popen | None = None
        self.exits: list[int] = []
        self._mark = 0

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "LOGBUS_ZOOKEEPER"}
        self._mark = self.log.stat().st_size if self.log.exists() else 0
        self.process = subprocess.Popen(self.args, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, env=env)

    def copying(self) -> bool:
        """Whether this run has started copying (read its checkpoints): past the point
        where SIGTERM is a clean stop."""
        with self.log.open("rb") as log:
            log.seek(self._mark)
            return b" from offset " in log.read()

    def keep_running(self) -> None:
        if self.process.poll() is not None:
            self.exits.append(self.process.returncode)
            self.start()

    def kill(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)
        else:
            self.exits.append(self.process.returncode)
        self.process = None

    def stop(self) -> int:
        """SIGTERM: the mirror writes its checkpoints and exits; its exit status."""
        self.process.send_signal(signal.SIGTERM)
        code, self.process = self.process.wait(60), None
        return code


def mirrored(target: str) -> dict[int, list[bytes]]:
    """The target's values, by partition."""
    return {p: [m.value for m in messages] for p, messages in read_topic(target, TOPIC).items()}


def target_end(metadata) -> int:
    """The sum of the target partitions' end offsets; -1 while a leader move hides one."""
    try:
        total = 0
        for partition in range(PARTITIONS):
            with SimpleConsumer(TOPIC, partition, metadata=metadata, max_wait_ms=0) as consumer:
                total += consumer.latest()
        return total
    except (LogbusError, OSError):
        return -1


def holds_all(target: str, producers: list[OldEventProducer]) -> bool:
    """Whether the target holds every value sent (False while a leader move hides a partition)."""
    try:
        values = mirrored(target)
    except (LogbusError, OSError):
        return False
    return all({b"%s:%d:%d" % (p.name.encode(), partition, seq) for p in producers for seq in range(p.sent[partition])}
               <= set(values.get(partition, ())) for partition in range(PARTITIONS))


def kill_a_leader(target: LocalCluster, zk, partition: int) -> None:
    """SIGKILL the leader of `partition`, wait for another, restart it, and wait for the
    full ISR again."""
    leader = state(zk, TOPIC, partition).leader
    target.brokers[leader].kill()
    wait_for_state(zk, TOPIC, partition, lambda s: s.leader not in (-1, leader), "a new leader", 60)
    target.start_broker(leader)
    wait_for_state(zk, TOPIC, partition, lambda s: len(s.isr) == 3, "the killed broker back in the ISR", 60)


def restart_a_broker(target: LocalCluster, zk, partition: int) -> None:
    """A clean stop and start of the leader of `partition`."""
    leader = state(zk, TOPIC, partition).leader
    target.brokers[leader].stop()
    target.start_broker(leader)
    wait_for_state(zk, TOPIC, partition, lambda s: len(s.isr) == 3, "the restarted broker back in the ISR", 60)


@pytest.mark.parametrize("kills", [4, pytest.param(10, marks=pytest.mark.long)])
def test_old_events_mirrored_once_across_kills_of_the_mirror(clusters, tmp_path, kills):
    """Before issue 33 the target forgot the mirror's producer ids at its next retention
    check (their messages being stamped over a day ago), and every restarted mirror's
    re-sent batches were stored again: 345 extra copies in one partition over ten kills
    (`make test-long`), 70 over three. `make test` kills it four times."""
    sources = {name: clusters[name][0] for name in SOURCES}
    target, target_cluster = clusters["offline"]
    for connect in sources.values():
        with client(connect) as zk:
            create_topic(zk, TOPIC, PARTITIONS)
    stop = threading.Event()
    producers = [OldEventProducer(name, connect, stop) for name, connect in sources.items()]
    mirror = MirrorService(target, sources, tmp_path / "mirror.log")
    rng = random.Random(33)
    faults = {kills // 3: kill_a_leader, 2 * kills // 3: restart_a_broker}
    metadata = open_metadata(target)
    try:
        with client(target) as zk:
            create_replicated_topic(target_cluster, zk, TOPIC, PARTITIONS, replication_factor=3)
            for producer in producers:
                producer.start()
            for kill in range(kills):
                mirror.start()
                before = target_end(metadata)
                wait_until(lambda: target_end(metadata) > before or not any(p.is_alive() for p in producers), 60,
                           f"the mirror to write before kill {kill}", 0.2)
                if kill in faults:
                    faults[kill](target_cluster, zk, kill % PARTITIONS)
                time.sleep(rng.uniform(0, 1.5))  # the random moment: mid-write, mid-checkpoint
                mirror.kill()
        mirror.start()
        stop.set()
        for producer in producers:
            producer.join(120)
        assert not [p.error for p in producers if p.error], [p.error for p in producers]

        def caught_up() -> bool:
            mirror.keep_running()  # restarted if it exited on its own, as a service manager would
            return mirror.copying() and holds_all(target, producers)

        wait_until(caught_up, 120, "the mirror to catch up", 1)
        assert mirror.stop() == 0, mirror.log.read_text()[-3000:]
        values = mirrored(target)
    finally:
        stop.set()
        for producer in producers:
            producer.join(120)
        mirror.kill()
        metadata.close()
    for partition in range(PARTITIONS):
        copies = Counter(values[partition])
        extra = {v: n for v, n in copies.items() if n > 1}
        assert not extra, f"partition {partition}: {sum(extra.values()) - len(extra)} extra copies, e.g. " \
                          f"{sorted(extra)[:3]}; mirror exits on their own: {mirror.exits}"
        for producer in producers:
            prefix = b"%s:%d:" % (producer.name.encode(), partition)
            seqs = [int(v[len(prefix):]) for v in values[partition] if v.startswith(prefix)]
            assert seqs == list(range(producer.sent[partition])), f"{producer.name} partition {partition}"

