"""File descriptors (issue 9.6): a broker whose partitions outnumber its open-files
limit creates them, serves them, and always starts again — segment files are opened
on use and held by a bounded cache, never one per partition."""

from __future__ import annotations

import os
import resource
import time
from contextlib import contextmanager

from broker.common.message import encode_message_set, iter_messages
from broker.common.protocol import ProducePart
from harness.process import wait_until
from tests.integration.brokerutil import connect

PARTITIONS = 2500
OPEN_FILES_LIMIT = 2048


@contextmanager
def open_files_limit(soft: int):
    """Processes started inside inherit a soft RLIMIT_NOFILE of `soft`."""
    old_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (old_soft, hard))


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_more_partitions_than_open_files_are_created_served_and_restarted(cluster):
    with open_files_limit(OPEN_FILES_LIMIT):
        broker = cluster.start_broker(0)
    started = time.monotonic()
    with connect(broker, timeout=120) as conn:
        conn.create_topic("many", PARTITIONS)
        wait_until(lambda: sum(1 for _ in broker.log_dir.glob("many-*")) == PARTITIONS, 120, "every partition's log")
        created_s = time.monotonic() - started
        for first in range(0, PARTITIONS, 250):
            parts = [ProducePart("many", p, encode_message_set([(None, b"p%d" % p, 1000)]))
                     for p in range(first, first + 250)]
            assert all(r.error_code == 0 for r in conn.multiproduce(parts, acks=1))
    fds_serving = open_fds(broker.process.pid)
    crashes_before_kill = 0 if broker.alive else 1

    broker.kill()  # an unclean stop: the next start recovers every partition
    with open_files_limit(OPEN_FILES_LIMIT):
        restart = time.monotonic()
        cluster.start_broker(0)
        restart_s = time.monotonic() - restart
    missing = []
    with connect(broker, timeout=120) as conn:
        wait_until(lambda: conn.offsets("many", 0, -1)[0] > 0, 60, "the restarted broker to serve")
        for p in range(PARTITIONS):
            got = [m.value for m in iter_messages(conn.fetch("many", p, 0, 1000).messages, 0)]
            if got != [b"p%d" % p]:
                missing.append(p)
    fds_after = open_fds(broker.process.pid)
    print(f"\n{PARTITIONS} partitions under a {OPEN_FILES_LIMIT} open-files limit: created and visible in "
          f"{created_s:.1f} s; open fds while serving {fds_serving}, after reading all after restart {fds_after}; "
          f"restart after kill -9 (recovery of every partition, ZooKeeper session expiry included) {restart_s:.1f} s; "
          f"crashes {crashes_before_kill}; partitions missing their message {len(missing)}")
    assert crashes_before_kill == 0
    assert missing == []
    assert fds_serving < OPEN_FILES_LIMIT and fds_after < OPEN_FILES_LIMIT
