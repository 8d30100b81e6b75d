"""The producer's hand-offs between callers and the sender thread, without brokers:
appends from many threads, the sender's nap, and futures settled without a lock.
The thread switch interval is made tiny so that every interleaving the GIL allows
is likely to happen."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from broker.client.accumulator import RecordAccumulator
from broker.client.results import BatchResult
from harness.process import wait_until


class OneLeader:
    def partitions(self, topic: str) -> dict[int, int]:
        return {0: 1}


@pytest.fixture
def switching():
    """Switch threads every microsecond instead of every 5 ms."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def run_threads(count: int, target) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize("exact", [False, True])
def test_messages_appended_from_many_threads_each_get_their_own_offset(switching, exact):
    """A future's place in its batch (index, byte position) is read under the lock
    that placed the message: four threads appending to one batch get 8,000 distinct
    offsets, those of their messages' places in the batch."""
    acc = RecordAccumulator(OneLeader(), batch_size=100_000, batch_bytes=1 << 30, linger=60.0, queue_size=100_000,
                            exact_offsets=exact)
    futures: list[list] = [[] for _ in range(4)]

    def append(i: int) -> None:
        for n in range(2000):
            futures[i].append(acc.append("t", None, b"%d-%d" % (i, n), 1, 0))

    run_threads(4, append)
    (batch, _), = acc.drain(time.monotonic() + 120, OneLeader().partitions)
    batch.result.succeed(0, 0)
    offsets = {f.result(0).offset: f for fs in futures for f in fs}
    assert len(offsets) == 8000
    position = index = 0
    for key, value, _ in batch.messages():  # each offset is the place of the message it was given for
        i, n = map(int, value.split(b"-"))
        assert futures[i][n].result(0).offset == (position if exact else index)
        position += 22 + len(value)
        index += 1


def test_a_napping_sender_wakes_when_a_batch_opens():
    """Callers notify the sender only while it naps: the message that opens a batch
    must end a nap of a minute, so that its linger is timed."""
    acc = RecordAccumulator(OneLeader(), batch_size=10, batch_bytes=1 << 20, linger=0.0, queue_size=100)
    woke = threading.Event()

    def nap() -> None:
        acc.wait_for_work(time.monotonic(), 60.0)
        woke.set()

    sender = threading.Thread(target=nap, daemon=True)
    sender.start()
    wait_until(lambda: acc._napping, 30, "the sender napping")
    acc.append("t", None, b"x", 1, 0)
    assert woke.wait(30), "the sender napped on with a batch open"


def test_a_waiter_racing_the_sender_always_sees_the_outcome(switching):
    """`BatchResult` is settled without a lock: a caller waiting on each of 3,000
    results while the sender settles them never misses one (it would wait its 60 s)."""
    results = [BatchResult("t", True) for _ in range(3000)]
    seen = []

    def wait(_: int) -> None:
        for result in results:
            result.wait(60)
            seen.append(result.base_offset)

    waiter = threading.Thread(target=wait, args=(0,))
    waiter.start()
    for offset, result in enumerate(results):
        result.succeed(0, offset)
    waiter.join(120)
    assert not waiter.is_alive()
    assert seen == list(range(3000))
