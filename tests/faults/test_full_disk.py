"""A full disk under acks=-1 load (issue 9.1): on a log directory on a tiny tmpfs,
produce until it fills. Every acknowledged message must be readable at its
acknowledged offset, the advertised end must equal the bytes on disk, refusals must be
StorageError (13), the broker's log must stay small (one line per state change, no
traceback storm), appends must resume by themselves once space is freed, and after
kill -9 and a restart every acknowledged message must still be there."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from broker.common.errors import LogbusError, StorageError
from broker.common.message import encode_message_set, scan
from harness.process import wait_until
from tests.integration.brokerutil import connect, read_partition

TMPFS_BYTES = 6 << 20
FILLER_BYTES = 2 << 20  # freed later: more than message.max.bytes, the probe's bar
LOG_BYTES_BAR = 64 << 10  # the broker's own log during the whole test


@pytest.fixture
def tiny_tmpfs(tmp_path: Path):
    """A 6 MiB tmpfs, always unmounted; skipped where mount is not permitted."""
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mountpoint)],
                       check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {detail}")
    try:
        yield mountpoint
    finally:
        if subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def disk_end(partition_dir: Path) -> int:
    """The end offset the segment files hold: they must be contiguous and whole entries."""
    end = None
    for segment in sorted(partition_dir.glob("*.kafka")):
        base = int(segment.name[:20])
        assert end is None or base == end, f"hole before {segment.name}"
        data = segment.read_bytes()
        result = scan(data)
        assert result.error is None, f"{segment.name}: {result.error}"  # no torn entry anywhere
        end = base + len(data)
    return end


def check_acknowledged(conn, acknowledged: dict[int, bytes]) -> int:
    """Acknowledged messages missing or different at their acknowledged offsets."""
    stored = {m.offset: m.value for m in read_partition(conn, "full", 0)}
    return sum(1 for offset, value in acknowledged.items() if stored.get(offset) != value)


def produce_batch(conn, n: int, acknowledged: dict[int, bytes]) -> None:
    """One acks=-1 batch of n messages; records each acknowledged message's offset."""
    values = [b"m-%06d-" % (len(acknowledged) + i) + b"." * 490 for i in range(n)]
    data = encode_message_set([(None, v, 1000) for v in values])
    result = conn.produce("full", 0, data, acks=-1)
    offset = result.base_offset
    for value in values:
        acknowledged[offset] = value
        offset += 4 + 18 + len(value)
    assert offset == result.next_offset


@pytest.mark.parametrize("segment_bytes", [1 << 20, 64 << 20], ids=["rolling", "one-segment"])
def test_full_disk_loses_nothing_acknowledged_and_recovers_by_itself(tiny_tmpfs, cluster, segment_bytes):
    """With small segments the disk fills around rolls; with one big segment a write is
    torn mid-segment (a short write, then ENOSPC) and must be cut back."""
    filler = tiny_tmpfs / "filler"
    filler.write_bytes(b"\0" * FILLER_BYTES)
    broker = cluster.start_broker(0, {
        "log.dirs": tiny_tmpfs / "logs", "log.segment.bytes": segment_bytes, "log.dir.probe.interval.ms": 200,
    })
    log_start = broker.log_path.stat().st_size
    partition_dir = tiny_tmpfs / "logs" / "full-0"
    acknowledged: dict[int, bytes] = {}
    refusals: list[LogbusError] = []
    with connect(broker) as conn:
        conn.create_topic("full", 1)
        deadline = time.monotonic() + 60
        while len(refusals) < 50 and time.monotonic() < deadline:  # fill it, then keep knocking
            try:
                produce_batch(conn, 20, acknowledged)
            except LogbusError as exc:
                refusals.append(exc)
        assert refusals, "the disk never filled"
        filled_with = len(acknowledged)

        advertised = conn.offsets("full", 0, -1)[0]
        on_disk = disk_end(partition_dir)
        lost_while_full = check_acknowledged(conn, acknowledged)

        filler.unlink()  # space returns: appends must resume by themselves
        wait_until(lambda: _try(conn, acknowledged), 30, "appends to resume after space was freed")
        for _ in range(5):
            produce_batch(conn, 20, acknowledged)
        lost_after_resume = check_acknowledged(conn, acknowledged)
        wait_until(lambda: conn.offsets("full", 0, -1)[0] == disk_end(partition_dir), 30, "the flush after resuming")
        assert min(o for o in acknowledged if o >= advertised) == advertised  # resumed at the end: no gap

    crashes = 0 if broker.alive else 1
    log_bytes = broker.log_path.stat().st_size - log_start
    log_text = broker.log_path.read_text()[log_start:]
    broker.kill()
    cluster.start_broker(0)
    with connect(broker) as conn:
        lost_after_crash = check_acknowledged(conn, acknowledged)
        end_after_crash = conn.offsets("full", 0, -1)[0]
    print(f"\nfull disk: {filled_with} messages acknowledged before it filled, {len(acknowledged)} in all; "
          f"{len(refusals)} refusals ({sorted({type(e).__name__ for e in refusals})}); advertised end {advertised}, "
          f"bytes on disk {on_disk}; acknowledged lost: {lost_while_full} while full, {lost_after_resume} after "
          f"resuming, {lost_after_crash} after kill -9; crashes {crashes}; broker log {log_bytes} bytes, "
          f"{log_text.count('Traceback')} tracebacks, {log_text.count('is OFFLINE')} offline and "
          f"{log_text.count('is ONLINE')} online lines")
    assert all(isinstance(e, StorageError) and e.code == 13 for e in refusals)
    assert advertised == on_disk
    assert (lost_while_full, lost_after_resume, lost_after_crash, crashes) == (0, 0, 0, 0)
    assert end_after_crash >= max(acknowledged) + 1
    assert log_text.count("Traceback") == 0
    assert log_text.count("is OFFLINE") >= 1 and log_text.count("is ONLINE") >= 1
    assert log_bytes < LOG_BYTES_BAR


def _try(conn, acknowledged) -> bool:
    try:
        produce_batch(conn, 1, acknowledged)
        return True
    except StorageError:
        return False
