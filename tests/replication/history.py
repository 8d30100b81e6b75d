"""A history checker for replication (issue 11), after Jepsen's way of testing: record
what clients were told while faults hit the cluster, then check the final state of
every replica against that record.

- `fault_schedule(seed)` is a pure function: the same seed gives the same faults, so a
  failing run is replayed from its seed. Faults name roles ("the leader of partition
  1"), resolved against ZooKeeper's state nodes when they fire.
- `pingpong_schedule(seed)` is the other schedule: leadership moved away and back
  (to a follower, then the controller's preferred-leader rebalance hands it back)
  while followers are paused briefly — not long enough to leave the ISR — and often
  moved onto the paused follower, so the old leader truncates what it appended.
- `ProducerWorker` threads send numbered messages with acks=-1 and retry themselves
  (the producer's own retries are 0), so every attempt is recorded: the value is
  JSON `{"producer", "seq", "attempt"}` and the `SendLog` knows which attempt was
  acknowledged at which offset and which attempts failed. `PipelinedProducerWorker`s
  do the same with bursts of pipelined requests (one message each), which is what
  leaves acks=-1 answers waiting while leadership moves. `IdempotentProducerWorker`s
  leave retrying to an idempotent producer (docs/clients.md, "Idempotence"): each
  message is sent once, as attempt 0, in batches of several, so any copy of it beyond
  the first is a duplicate the broker should have dropped.
- A `ConsumerWorker` reads every partition continuously and records
  (partition, offset, value) of everything it was given.
- `read_replica` reads a partition straight from a broker's segment files;
  `check_history` compares replicas and the records.

The rules `check_history` enforces (a failed attempt may or may not have been
appended — a timeout, NotEnoughReplicasAfterAppend or a lost connection says nothing
— so a retried message may legitimately be present more than once, once per attempt):

1. every replica of a partition holds the same bytes;
2. every acknowledged attempt is in the log at the offset it was acknowledged with;
3. no value — an attempt (producer, seq, attempt) — appears more than once anywhere:
   the broker never writes one request twice, nor, for an idempotent producer, one
   batch twice however often the producer retries it — hence an acknowledged message
   whose first attempt succeeded appears exactly once, and any message at most once
   per attempt;
4. nothing appears that no producer sent;
5. the acknowledged messages of one producer in one partition are in seq order
   (not checked for pipelined producers: without idempotence a retry may land after
   a later message, as in Kafka with more than one request in flight);
6. every (partition, offset, value) a consumer read is still there.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from broker.client.security import OPEN, ClientSecurity
from broker.common.message import iter_messages

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------ the schedule

KILL_LEADER = "kill-leader"          # kill -9 the partition's leader; restart it after `hold`
KILL_FOLLOWER = "kill-follower"      # kill -9 one of its followers; restart it after `hold`
PAUSE_LEADER = "pause-leader"        # SIGSTOP past replica.lag.time.max.ms, then SIGCONT
PAUSE_FOLLOWER = "pause-follower"
EXPIRE_SESSION = "expire-session"    # SIGSTOP past the ZooKeeper session timeout, then SIGCONT
KILL_ZOOKEEPER = "kill-zookeeper"    # stop one ZooKeeper server of the ensemble, start it after `hold`
MOVE_LEADER = "move-leader"          # give the lead to an in-sync follower (a new epoch), as a rebalance does
PAUSE_BRIEFLY = "pause-briefly"      # SIGSTOP a follower for less than the lag time: it stays in the ISR

BROKER_FAULTS = (KILL_LEADER, KILL_FOLLOWER, PAUSE_LEADER, PAUSE_FOLLOWER, EXPIRE_SESSION)
BROKER_WEIGHTS = (3, 2, 1, 2, 2)


@dataclass(frozen=True)
class Fault:
    """One fault: at `at` seconds after the start, do `kind` to the broker playing
    `role` in `partition` (`pick` chooses among followers), undo it `hold` seconds later."""

    index: int
    at: float
    kind: str
    partition: int
    pick: int
    hold: float
    move_after: float | None = None  # PAUSE_BRIEFLY: then give the paused follower the lead, this much later

    @property
    def healed_at(self) -> float:
        return self.at + self.hold

    def __str__(self) -> str:
        target = f"zookeeper server #{self.pick}" if self.kind == KILL_ZOOKEEPER else f"partition {self.partition}"
        then = "" if self.move_after is None else f", leadership moved onto it after {self.move_after:.2f}s"
        return f"#{self.index} t={self.at:.2f}s {self.kind} ({target}) for {self.hold:.2f}s{then}"


def fault_schedule(
    seed: int, count: int = 30, partitions: int = 3, lag_ms: int = 1000, session_ms: int = 2000,
    gap: tuple[float, float] = (1.0, 2.0), max_concurrent: int = 2, zookeeper_servers: int = 3,
) -> list[Fault]:
    """`count` faults, one of them a ZooKeeper server's death, starting `gap` seconds
    apart; never more than `max_concurrent` disrupted at once (a fault waits for the
    earliest heal), so with three brokers one always runs. Pauses last past the lag
    time but not the session timeout; session expiries past the session timeout."""
    rng = random.Random(seed)
    zookeeper_at = rng.randrange(count)
    faults: list[Fault] = []
    at = 1.0
    for index in range(count):
        kind = KILL_ZOOKEEPER if index == zookeeper_at else rng.choices(BROKER_FAULTS, BROKER_WEIGHTS)[0]
        lag, session = lag_ms / 1000, session_ms / 1000
        hold = {
            KILL_LEADER: rng.uniform(0.5, 2.5),
            KILL_FOLLOWER: rng.uniform(0.5, 2.5),
            PAUSE_LEADER: rng.uniform(1.5 * lag, max(1.6 * lag, 0.8 * session)),
            PAUSE_FOLLOWER: rng.uniform(1.5 * lag, max(1.6 * lag, 0.8 * session)),
            EXPIRE_SESSION: rng.uniform(1.5 * session, 2.0 * session),
            KILL_ZOOKEEPER: rng.uniform(2.0, 4.0),
        }[kind]
        pick = rng.randrange(zookeeper_servers if kind == KILL_ZOOKEEPER else 2)
        partition = rng.randrange(partitions)
        active = sorted(f.healed_at for f in faults if f.healed_at > at)
        if len(active) >= max_concurrent:
            at = active[len(active) - max_concurrent] + 0.1
        faults.append(Fault(index, round(at, 2), kind, partition, pick, round(hold, 2)))
        at += rng.uniform(*gap)
    return faults


def pingpong_schedule(seed: int, count: int = 30, partitions: int = 3, lag_ms: int = 1000,
                      gap: tuple[float, float] = (0.8, 1.6)) -> list[Fault]:
    """Leadership ping-pong (issue 18): `count` faults, each either a move of a
    partition's lead to one of its in-sync followers (the controller's rebalance, every
    few seconds, moves it back to the preferred replica) or a brief pause of a follower
    (0.3–0.6 s and under half the lag time, so it stays in the ISR and holds the high
    watermark), two times in three followed by a move of the lead onto the paused
    follower while it is paused. One broker at most is paused at a time."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    at = 1.0
    for index in range(count):
        kind = rng.choices((MOVE_LEADER, PAUSE_BRIEFLY), (1, 2))[0]
        partition, pick = rng.randrange(partitions), rng.randrange(2)
        if kind == MOVE_LEADER:
            faults.append(Fault(index, round(at, 2), kind, partition, pick, 0.0))
        else:
            hold = rng.uniform(0.3, min(0.6, 0.5 * lag_ms / 1000))
            paused = [f.healed_at for f in faults if f.kind == PAUSE_BRIEFLY and f.healed_at > at]
            if paused:
                at = max(paused) + 0.1
            move_after = round(rng.uniform(0.05, hold - 0.05), 2) if rng.random() < 2 / 3 else None
            faults.append(Fault(index, round(at, 2), kind, partition, pick, round(hold, 2), move_after))
        at += rng.uniform(*gap)
    return faults


# ------------------------------------------------------------------ what clients saw


@dataclass
class SendLog:
    """Every attempt of every message: the acknowledged ones with their offset, the
    failed ones with their error. Thread-safe."""

    attempts: dict[tuple[int, int], int] = field(default_factory=dict)  # (producer, seq) -> attempts made
    partition_of: dict[tuple[int, int], int] = field(default_factory=dict)
    acked: dict[tuple[int, int], tuple[int, int, int]] = field(default_factory=dict)  # -> (attempt, partition, offset)
    failures: Counter = field(default_factory=Counter)  # error class name -> count
    unordered: set[int] = field(default_factory=set)  # pipelined producers: rule 5 does not apply
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def attempt(self, producer: int, seq: int, attempt: int, partition: int) -> None:
        with self._lock:
            self.attempts[(producer, seq)] = attempt + 1
            self.partition_of[(producer, seq)] = partition

    def ack(self, producer: int, seq: int, attempt: int, partition: int, offset: int) -> None:
        with self._lock:
            self.acked[(producer, seq)] = (attempt, partition, offset)

    def fail(self, error: BaseException) -> None:
        cause = getattr(error, "cause", None) or error
        with self._lock:
            self.failures[type(cause).__name__] += 1


def encode_value(producer: int, seq: int, attempt: int) -> bytes:
    return json.dumps({"producer": producer, "seq": seq, "attempt": attempt}, separators=(",", ":")).encode()


def decode_value(value: bytes) -> tuple[int, int, int] | None:
    try:
        item = json.loads(value)
        return int(item["producer"]), int(item["seq"]), int(item["attempt"])
    except (ValueError, KeyError, TypeError):
        return None


class ProducerWorker(threading.Thread):
    """Sends seq 0, 1, 2, ... round-robin over the partitions with acks=-1, one at a
    time, retrying a failed message (as a new attempt) until it is acknowledged or
    the run stops."""

    def __init__(self, index: int, zookeeper: str, topic: str, partitions: int, log: SendLog,
                 stop: threading.Event, backoff: float = 0.1, security: ClientSecurity = OPEN) -> None:
        super().__init__(name=f"history-producer-{index}", daemon=True)
        self.index, self.zookeeper, self.topic, self.partitions = index, zookeeper, topic, partitions
        self.log, self.stop_event, self.backoff, self.security = log, stop, backoff, security

    def run(self) -> None:
        from broker.client.producer import Producer

        with Producer(zookeeper=self.zookeeper, acks=-1, retries=0, mode="sync", monitoring=False,
                      delivery_timeout_ms=4000, request_timeout_ms=4000, security=self.security) as producer:
            seq = 0
            while not self.stop_event.is_set():
                partition = (seq + self.index) % self.partitions
                attempt = 0
                while not self.stop_event.is_set():
                    self.log.attempt(self.index, seq, attempt, partition)
                    try:
                        sent = producer.send(self.topic, encode_value(self.index, seq, attempt), partition=partition)
                    except Exception as exc:  # every failure is one failed attempt; the message is retried
                        self.log.fail(exc)
                        attempt += 1
                        time.sleep(self.backoff)
                        continue
                    self.log.ack(self.index, seq, attempt, sent.partition, sent.offset)
                    break
                seq += 1


class IdempotentProducerWorker(threading.Thread):
    """Sends seq 0, 1, 2, ... to one partition with acks=-1 through an idempotent async
    producer that does the retrying (batches of up to `batch` messages, several in
    flight), so each message is one attempt: a message the producer gives up on is
    recorded as failed, never sent again."""

    def __init__(self, index: int, zookeeper: str, topic: str, partition: int, log: SendLog,
                 stop: threading.Event, batch: int = 5, window: int = 50) -> None:
        super().__init__(name=f"history-idempotent-{index}", daemon=True)
        self.index, self.zookeeper, self.topic, self.partition = index, zookeeper, topic, partition
        self.log, self.stop_event, self.batch, self.window = log, stop, batch, window

    def run(self) -> None:
        from broker.client.producer import Producer

        with Producer(zookeeper=self.zookeeper, acks=-1, retries=1000, retry_backoff_ms=100, mode="async",
                      batch_size=self.batch, linger_ms=2, monitoring=False, delivery_timeout_ms=120_000,
                      request_timeout_ms=4000) as producer:
            seq = 0
            while not self.stop_event.is_set():
                futures = []
                for _ in range(self.window):
                    self.log.attempt(self.index, seq, 0, self.partition)
                    futures.append((seq, producer.send(self.topic, encode_value(self.index, seq, 0),
                                                       partition=self.partition)))
                    seq += 1
                for item_seq, future in futures:
                    try:
                        metadata = future.result(150)
                    except Exception as exc:
                        self.log.fail(exc)
                    else:
                        self.log.ack(self.index, item_seq, 0, metadata.partition, metadata.offset)


class PipelinedProducerWorker(threading.Thread):
    """Sends bursts of `burst` numbered messages to one partition at a time with
    acks=-1, each message its own request, all in flight at once (an async producer
    with batches of one); a failed message is retried, as a new attempt, in a later
    burst. Its answers are what waits on the leader while leadership moves."""

    def __init__(self, index: int, zookeeper: str, topic: str, partitions: int, log: SendLog,
                 stop: threading.Event, burst: int = 20, backoff: float = 0.1, security: ClientSecurity = OPEN) -> None:
        super().__init__(name=f"history-pipelined-{index}", daemon=True)
        self.index, self.zookeeper, self.topic, self.partitions = index, zookeeper, topic, partitions
        self.log, self.stop_event, self.burst, self.backoff, self.security = log, stop, burst, backoff, security
        log.unordered.add(index)

    def run(self) -> None:
        from broker.client.producer import Producer

        with Producer(zookeeper=self.zookeeper, acks=-1, retries=0, mode="async", batch_size=1, linger_ms=0,
                      monitoring=False, delivery_timeout_ms=4000, request_timeout_ms=4000,
                      security=self.security) as producer:
            retry: dict[int, list[tuple[int, int]]] = defaultdict(list)  # partition -> [(seq, attempt)]
            seq, round_ = 0, 0
            while not self.stop_event.is_set():
                partition = (round_ + self.index) % self.partitions
                round_ += 1
                items = retry.pop(partition, [])
                while len(items) < self.burst:
                    items.append((seq, 0))
                    seq += 1
                sent = []
                for item_seq, attempt in items:
                    self.log.attempt(self.index, item_seq, attempt, partition)
                    sent.append(producer.send(self.topic, encode_value(self.index, item_seq, attempt),
                                              partition=partition))
                failed = False
                for (item_seq, attempt), future in zip(items, sent):
                    try:
                        metadata = future.result(30)
                    except Exception as exc:
                        self.log.fail(exc)
                        retry[partition].append((item_seq, attempt + 1))
                        failed = True
                    else:
                        self.log.ack(self.index, item_seq, attempt, metadata.partition, metadata.offset)
                if failed:
                    time.sleep(self.backoff)


@dataclass(frozen=True)
class Seen:
    partition: int
    offset: int
    value: bytes


class ConsumerWorker(threading.Thread):
    """Reads every partition from the start, round-robin, recording what it is given.
    An OffsetOutOfRange at an offset it reached (data taken back under it) is recorded
    as an anomaly, and it keeps asking at the same offset."""

    def __init__(self, zookeeper: str, topic: str, partitions: int, stop: threading.Event,
                 security: ClientSecurity = OPEN) -> None:
        super().__init__(name="history-consumer", daemon=True)
        self.zookeeper, self.topic, self.partitions, self.stop_event = zookeeper, topic, partitions, stop
        self.security = security
        self.seen: list[Seen] = []
        self.anomalies: list[str] = []
        self.offsets = [0] * partitions

    def run(self) -> None:
        from broker.client.metadata import open_metadata
        from broker.client.consumer import SimpleConsumer
        from broker.common.errors import OffsetOutOfRange

        metadata = open_metadata(self.zookeeper, None, "history-consumer", security=self.security)
        consumers = [SimpleConsumer(self.topic, p, metadata=metadata, offset=0, auto_offset_reset="error",
                                    max_wait_ms=50, retry_timeout_ms=500) for p in range(self.partitions)]
        try:
            while not self.stop_event.is_set():
                for partition, consumer in enumerate(consumers):
                    try:
                        messages = consumer.fetch()
                    except OffsetOutOfRange as exc:
                        self.anomalies.append(f"t={time.monotonic():.1f} partition {partition}: {exc}")
                        time.sleep(0.1)
                        continue
                    except Exception as exc:  # unavailable during a fault: try again
                        logger.debug("consumer %d: %s", partition, exc)
                        continue
                    self.seen.extend(Seen(partition, m.offset, m.value) for m in messages)
                    self.offsets[partition] = consumer.offset
        finally:
            for consumer in consumers:
                consumer.close()
            metadata.close()


# ------------------------------------------------------------------ the replicas


def read_replica(log_dir: Path, topic: str, partition: int) -> tuple[int, bytes]:
    """A partition's bytes as one broker holds them: (start offset, bytes), its
    segment files concatenated in offset order. Gaps between segments are an error."""
    directory = Path(log_dir) / f"{topic}-{partition}"
    segments = sorted(directory.glob("*.kafka"), key=lambda p: int(p.stem))
    if not segments:
        return 0, b""
    start = int(segments[0].stem)
    data = bytearray()
    for path in segments:
        base = int(path.stem)
        if base != start + len(data):
            raise AssertionError(f"{path}: segment starts at {base}, the previous one ends at {start + len(data)}")
        data += path.read_bytes()
    return start, bytes(data)


def replica_ends(log_dirs: dict[int, Path], topic: str, partition: int, replicas: list[int]) -> dict[int, int]:
    """Each replica's log end offset on disk (what a follower has written)."""
    ends = {}
    for broker in replicas:
        start, data = read_replica(log_dirs[broker], topic, partition)
        ends[broker] = start + len(data)
    return ends


@dataclass
class Verdict:
    problems: list[str]
    stats: dict[str, object]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_history(
    replicas: dict[int, dict[int, tuple[int, bytes]]], log: SendLog, seen: list[Seen],
) -> Verdict:
    """Check the rules of the module docstring. `replicas[partition][broker]` is
    (start offset, bytes) from `read_replica`."""
    problems: list[str] = []
    at: dict[tuple[int, int], list[bytes]] = defaultdict(list)  # (partition, offset) -> values (a batch's share one)
    where: dict[tuple[int, int, int], list[tuple[int, int]]] = defaultdict(list)  # attempt -> [(partition, offset)]
    for partition, copies in sorted(replicas.items()):
        reference_broker = max(sorted(copies), key=lambda b: len(copies[b][1]))  # the most complete copy
        start, data = copies[reference_broker]
        for broker, copy in sorted(copies.items()):
            if copy != (start, data):
                problems.append(f"partition {partition}: broker {broker}'s replica (start {copy[0]}, "
                                f"{len(copy[1])} bytes) differs from broker {reference_broker}'s (start {start}, "
                                f"{len(data)} bytes) from byte {_first_difference(copy, (start, data))}")
        try:
            for message in iter_messages(data, start):
                at[(partition, message.offset)].append(message.value)
                item = decode_value(message.value)
                if item is None:
                    problems.append(f"partition {partition} offset {message.offset}: not a history message "
                                    f"{message.value[:80]!r}")
                    continue
                where[item].append((partition, message.offset))
        except Exception as exc:
            problems.append(f"partition {partition} (broker {reference_broker}): undecodable: {exc}")

    for (producer, seq), (attempt, partition, offset) in sorted(log.acked.items()):
        values = at.get((partition, offset), [])
        if (producer, seq, attempt) not in map(decode_value, values):
            found = where.get((producer, seq, attempt))
            problems.append(f"LOST acknowledged producer {producer} seq {seq} attempt {attempt} "
                            f"(acked at {partition}@{offset}); at that offset: "
                            f"{[decode_value(v) for v in values][:3]}; found at {found}")
    sent = {(p, s, a) for (p, s), n in log.attempts.items() for a in range(n)}
    for item, places in sorted(where.items()):
        if len(places) > 1:
            problems.append(f"DUPLICATE attempt producer {item[0]} seq {item[1]} attempt {item[2]} at {places}")
        if item not in sent:
            problems.append(f"PHANTOM producer {item[0]} seq {item[1]} attempt {item[2]} at {places}: never sent")
    acked_offsets: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for (producer, seq), (_, partition, offset) in log.acked.items():
        if producer in log.unordered:
            continue
        acked_offsets[(producer, partition)].append((seq, offset))
    for (producer, partition), pairs in sorted(acked_offsets.items()):
        offsets = [offset for _, offset in sorted(pairs)]
        if offsets != sorted(offsets):
            problems.append(f"REORDERED producer {producer} partition {partition}: acked offsets not in seq order")
    for item in seen:
        if item.value not in at.get((item.partition, item.offset), []):
            problems.append(f"TAKEN BACK consumer read {decode_value(item.value)} at {item.partition}@{item.offset}; "
                            f"now there: {at.get((item.partition, item.offset), [])[:3]!r}")
    duplicates = sum(1 for n in Counter((p, s) for p, s, _ in where).values() if n > 1)
    stats = {
        "sent": len(log.attempts), "acked": len(log.acked), "failed attempts": sum(log.failures.values()),
        "failures": dict(log.failures), "in logs": len(where), "retried duplicates": duplicates,
        "consumed": len(seen), "log bytes": {p: len(next(iter(c.values()))[1]) for p, c in replicas.items()},
    }
    return Verdict(problems, stats)


def _first_difference(a: tuple[int, bytes], b: tuple[int, bytes]) -> int:
    if a[0] != b[0]:
        return min(a[0], b[0])
    for i, (x, y) in enumerate(zip(a[1], b[1])):
        if x != y:
            return a[0] + i
    return a[0] + min(len(a[1]), len(b[1]))


# ------------------------------------------------------------------ running a history


def partition_roles(zk, topic: str, partition: int) -> tuple[int, list[int]]:
    """(leader, ISR) from the partition's state node (leader -1: offline)."""
    from broker.common.zklayout import read_partition_state

    state = zk.retry(read_partition_state, zk, topic, partition).state
    return state.leader, list(state.isr)


class FaultInjector(threading.Thread):
    """Plays a schedule against live processes: each fault at its time, its undoing
    `hold` seconds later. Roles are resolved when a fault fires; if the broker named
    is already disrupted, the lowest-numbered undisrupted broker is hit instead (said
    in the log). `log` is the fault log printed with a failure."""

    def __init__(self, schedule: list[Fault], cluster, ensemble, zk, topic: str,
                 assignment: dict[int, list[int]], stop: threading.Event) -> None:
        super().__init__(name="history-faults", daemon=True)
        self.schedule, self.cluster, self.ensemble, self.zk = schedule, cluster, ensemble, zk
        self.topic, self.assignment, self.stop_event = topic, assignment, stop
        self.log: list[str] = []
        self.targets: dict[int, int] = {}  # fault index -> broker id (or ZooKeeper server index)
        self.killed: set[int] = set()
        self.paused: set[int] = set()
        self.zookeeper_stopped: set[int] = set()
        self.crashed: list[str] = []  # brokers that exited without being killed: a bug
        self._start = 0.0
        self.error: BaseException | None = None

    def note(self, text: str) -> None:
        line = f"[{time.monotonic() - self._start:6.2f}s] {text}"
        self.log.append(line)
        logger.info("history: %s", line)

    def run(self) -> None:
        self._start = time.monotonic()
        steps = (self.heal, self.disrupt, self.move_onto_target)
        events = sorted([(f.at, 1, f) for f in self.schedule] + [(f.healed_at, 0, f) for f in self.schedule]
                        + [(f.at + f.move_after, 2, f) for f in self.schedule if f.move_after is not None],
                        key=lambda e: (e[0], e[1], e[2].index))
        try:
            for at, step, fault in events:
                if self.stop_event.wait(max(0.0, self._start + at - time.monotonic())):
                    return
                steps[step](fault)
        except BaseException as exc:  # reported by the test, with the fault log
            self.error = exc
            self.note(f"injector failed: {exc!r}")

    def _choose(self, fault: Fault) -> tuple[int, str]:
        leader, isr = partition_roles(self.zk, self.topic, fault.partition)
        replicas = self.assignment[fault.partition]
        followers = [b for b in replicas if b != leader]
        if fault.kind == MOVE_LEADER:
            followers = [b for b in followers if b in isr] or followers
        wants_leader = fault.kind in (KILL_LEADER, PAUSE_LEADER) or (fault.kind == EXPIRE_SESSION and fault.pick == 0)
        broker = leader if wants_leader and leader >= 0 else followers[fault.pick % len(followers)]
        note = f"leader {leader} isr {isr}"
        if broker in self.killed | self.paused:
            spare = sorted(set(self.cluster.brokers) - self.killed - self.paused)
            note += f"; broker {broker} already down, hitting {spare[0]} instead"
            broker = spare[0]
        return broker, note

    def disrupt(self, fault: Fault) -> None:
        if fault.kind == KILL_ZOOKEEPER:
            self.targets[fault.index] = fault.pick
            self.ensemble.stop_server(fault.pick)
            self.zookeeper_stopped.add(fault.pick)
            self.note(f"{fault}: stopped ZooKeeper server {fault.pick}")
            return
        broker_id, why = self._choose(fault)
        if fault.kind == MOVE_LEADER:
            self.note(f"{fault}: {self.move_lead(fault.partition, broker_id)} ({why})")
            return
        self.targets[fault.index] = broker_id
        broker = self.cluster.brokers[broker_id]
        if fault.kind in (KILL_LEADER, KILL_FOLLOWER):
            broker.kill()
            self.killed.add(broker_id)
        else:
            broker.pause()
            self.paused.add(broker_id)
        self.note(f"{fault}: broker {broker_id} ({why})")

    def move_onto_target(self, fault: Fault) -> None:
        target = self.targets.get(fault.index)
        if target is not None and target in self.paused:
            self.note(f"#{fault.index} {self.move_lead(fault.partition, target)} (paused)")

    def move_lead(self, partition: int, broker_id: int) -> str:
        """Give `broker_id` the lead of `partition` in a new epoch, as the controller's
        rebalance does (compare-and-set on the state node): only from a live leader to
        an in-sync follower, so the move is one an election could make."""
        from broker.common.zklayout import PartitionState, read_partition_state, write_partition_state

        node = self.zk.retry(read_partition_state, self.zk, self.topic, partition)
        state = node.state
        if state.leader < 0 or state.leader == broker_id or broker_id not in state.isr:
            return f"lead of partition {partition} not moved to {broker_id} (leader {state.leader}, isr {state.isr})"
        moved = PartitionState(broker_id, state.leader_epoch + 1, state.isr, state.controller_epoch, state.version)
        if self.zk.retry(write_partition_state, self.zk, self.topic, partition, moved, node.version) is None:
            return f"lead of partition {partition} not moved to {broker_id}: the state changed meanwhile"
        return f"lead of partition {partition} moved {state.leader} -> {broker_id}, epoch {moved.leader_epoch}"

    def heal(self, fault: Fault) -> None:
        target = self.targets.get(fault.index)
        if target is None:
            return
        if fault.kind == KILL_ZOOKEEPER:
            if target not in self.zookeeper_stopped:
                return
            self.zookeeper_stopped.discard(target)
            self.ensemble.start_server(target)
            self.note(f"#{fault.index} heal: started ZooKeeper server {target}")
        elif target in self.killed:
            self.killed.discard(target)
            self.cluster.start_broker(target, wait=False)
            self.note(f"#{fault.index} heal: restarted broker {target}")
        elif target in self.paused:
            self.paused.discard(target)
            self.cluster.brokers[target].resume()
            self.note(f"#{fault.index} heal: resumed broker {target}")

    def heal_everything(self) -> None:
        for fault in self.schedule:
            if fault.index in self.targets:
                self.heal(fault)
        for broker_id, broker in self.cluster.brokers.items():
            if not broker.alive:
                self.crashed.append(f"broker {broker_id} exited on its own (code {broker.process.returncode}); "
                                    f"its log: {broker.log_path}")
                self.note(f"broker {broker_id} found dead at the end ({broker.process.returncode}); restarting")
                self.cluster.start_broker(broker_id, wait=False)


def wait_healed(zk, cluster, topic: str, assignment: dict[int, list[int]], consumer: ConsumerWorker | None,
                timeout: float) -> list[str]:
    """Wait until every partition has a leader, a full ISR, identical replica lengths on
    disk, and (given a consumer) the consumer has read to that end — which needs the
    high watermark there. Returns what was still unhealed at the timeout."""
    log_dirs = {b: broker.log_dir for b, broker in cluster.brokers.items()}
    deadline = time.monotonic() + timeout
    while True:
        missing = []
        for partition, replicas in sorted(assignment.items()):
            leader, isr = partition_roles(zk, topic, partition)
            if leader < 0 or sorted(isr) != sorted(replicas):
                missing.append(f"partition {partition}: leader {leader}, isr {isr}, replicas {replicas}")
                continue
            ends = replica_ends(log_dirs, topic, partition, replicas)
            if len(set(ends.values())) > 1:
                missing.append(f"partition {partition}: replica ends {ends}")
            elif consumer is not None and consumer.offsets[partition] != ends[leader]:
                missing.append(f"partition {partition}: consumer at {consumer.offsets[partition]}, end {ends[leader]}")
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.2)


@dataclass
class HistoryRun:
    seed: int
    schedule: list[Fault]
    verdict: Verdict
    fault_log: list[str]

    def report(self) -> str:
        lines = [f"history seed={self.seed}: {'OK' if self.verdict.ok else 'FAILED'}", f"stats: {self.verdict.stats}"]
        lines += ["problems:"] + [f"  {p}" for p in self.verdict.problems[:50]]
        if len(self.verdict.problems) > 50:
            lines.append(f"  ... and {len(self.verdict.problems) - 50} more")
        lines += ["fault log:"] + [f"  {line}" for line in self.fault_log]
        return "\n".join(lines)


def run_history(
    seed: int, cluster, ensemble, zk, topic: str, assignment: dict[int, list[int]], *,
    producers: int = 3, faults: int = 30, lag_ms: int = 1000, session_ms: int = 2000, heal_timeout: float = 60,
    pingpong: bool = False, pipelined: int = 0, security: ClientSecurity = OPEN,
) -> HistoryRun:
    """Producers (`producers` one message at a time, `pipelined` in bursts) and a
    consumer run through `fault_schedule(seed)` — or `pingpong_schedule(seed)` — then
    the cluster is healed and every replica checked. The topic exists with
    `assignment` ({partition: replicas}) and its leaders are up."""
    schedule = (pingpong_schedule(seed, faults, len(assignment), lag_ms) if pingpong
                else fault_schedule(seed, faults, len(assignment), lag_ms, session_ms))
    stop_clients, stop_faults = threading.Event(), threading.Event()
    log = SendLog()
    stop_consumer = threading.Event()  # it reads on until the cluster has healed
    consumer = ConsumerWorker(cluster.zookeeper, topic, len(assignment), stop_consumer, security)
    workers = [ProducerWorker(i, cluster.zookeeper, topic, len(assignment), log, stop_clients, security=security)
               for i in range(producers)]
    workers += [PipelinedProducerWorker(producers + i, cluster.zookeeper, topic, len(assignment), log, stop_clients,
                                        security=security) for i in range(pipelined)]
    injector = FaultInjector(schedule, cluster, ensemble, zk, topic, assignment, stop_faults)
    unhealed: list[str] = []
    try:
        consumer.start()
        for worker in workers:
            worker.start()
        injector.start()
        injector.join(schedule[-1].healed_at + 120)
    finally:
        stop_faults.set()
        injector.join(30)
        injector.heal_everything()
        injector.note("producers stopping; healing")
        stop_clients.set()
        for worker in workers:
            worker.join(30)
        unhealed = wait_healed(zk, cluster, topic, assignment, consumer, heal_timeout)
        injector.note("healed" if not unhealed else f"NOT healed after {heal_timeout:.0f}s: {unhealed}")
        stop_consumer.set()
        consumer.join(30)
    log_dirs = {b: broker.log_dir for b, broker in cluster.brokers.items()}
    replicas = {p: {b: read_replica(log_dirs[b], topic, p) for b in brokers} for p, brokers in assignment.items()}
    verdict = check_history(replicas, log, consumer.seen)
    verdict.problems[:0] = [f"NOT HEALED {m}" for m in unhealed] + [f"CRASHED {c}" for c in injector.crashed]
    verdict.stats["consumer out-of-range answers"] = consumer.anomalies[:10]
    if injector.error is not None:
        verdict.problems.insert(0, f"fault injector failed: {injector.error!r}")
    return HistoryRun(seed, schedule, verdict, injector.log)
