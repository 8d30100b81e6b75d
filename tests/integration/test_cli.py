"""The `logbus` command run as a subprocess, as an operator runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.process import free_port, wait_until
from tests.integration.clientutil import entry_count, produce_batch_and_gzip_set, wait_visible

LOGBUS = Path(sys.executable).parent / "logbus"


def logbus(zk_connect: str | None, *args: str, stdin: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LOGBUS_ZOOKEEPER"}
    if zk_connect is not None:
        env["LOGBUS_ZOOKEEPER"] = zk_connect
    return subprocess.run([str(LOGBUS), *args], input=stdin, capture_output=True, text=True, env=env,
                          timeout=timeout)


def assert_one_line_error(result: subprocess.CompletedProcess, text: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert text in result.stderr


@pytest.fixture
def broker(cluster):
    return cluster.start_broker(0, {"num.partitions": 2})


def test_topics_create_list_and_describe(broker, zk_connect):
    assert logbus(zk_connect, "topics", "create", "orders", "--partitions", "3").returncode == 0
    assert logbus(zk_connect, "topics", "list").stdout.split() == ["orders"]
    rows = logbus(zk_connect, "topics", "describe", "orders").stdout.strip().splitlines()[1:]
    assert [row.split("\t")[1] for row in rows] == ["0", "1", "2"]
    assert all("available" in row for row in rows)


def test_topics_create_with_a_replication_factor_above_the_live_brokers_is_one_line(broker, zk_connect):
    result = logbus(zk_connect, "topics", "--create", "wide", "--replication-factor", "3")
    assert_one_line_error(result, "replication factor 3")
    assert logbus(zk_connect, "topics", "--create", "narrow", "--replication-factor", "1").returncode == 0
    rows = logbus(zk_connect, "topics", "--describe", "narrow").stdout.strip().splitlines()
    assert rows[0].split("\t")[-3:] == ["epoch", "replicas", "isr"]
    assert rows[1].split("\t")[-3:] == ["0", "0", "0"]


def test_topics_create_rejects_a_bad_topic_name(broker, zk_connect):
    assert_one_line_error(logbus(zk_connect, "topics", "create", "no/slashes"), "invalid topic name")


def test_an_unreachable_zookeeper_is_a_one_line_error(tmp_path):
    result = logbus(f"127.0.0.1:{free_port()}", "--zookeeper-timeout", "1", "topics", "list")
    assert_one_line_error(result, "cannot connect to ZooKeeper")


def test_a_missing_zookeeper_setting_is_a_one_line_error():
    assert_one_line_error(logbus(None, "topics", "list"), "LOGBUS_ZOOKEEPER")


def test_produced_lines_come_back_from_consume(broker, zk_connect):
    lines = [f"k{i % 3}|value {i}" for i in range(30)]
    produced = logbus(zk_connect, "produce", "lines", "--key-separator", "|", stdin="\n".join(lines) + "\n")
    assert produced.returncode == 0, produced.stderr
    consumed = wait_until(
        lambda: (r := logbus(zk_connect, "consume", "lines", "--from-beginning", "--idle-timeout", "1"))
        and len(r.stdout.splitlines()) == 30 and r, 60, "30 lines")
    assert sorted(consumed.stdout.splitlines()) == sorted(line.split("|", 1)[1] for line in lines)


def test_consume_stops_after_count(broker, zk_connect):
    logbus(zk_connect, "produce", "counted", "--partition", "0", stdin="a\nb\nc\n")
    result = logbus(zk_connect, "consume", "counted", "--partition", "0", "--offset", "0", "--count", "2")
    assert result.stdout.splitlines() == ["a", "b"]


def test_consume_of_an_unknown_topic_fails(broker, zk_connect):
    assert_one_line_error(logbus(zk_connect, "consume", "nothing", "--idle-timeout", "1"), "unknown topic")


def test_offsets_of_a_topic_at_earliest_and_latest(broker, zk_connect):
    logbus(zk_connect, "produce", "measured", "--partition", "1", "--no-idempotence", stdin="abc\n")
    latest = wait_until(lambda: (r := logbus(zk_connect, "offsets", "measured")) and "25" in r.stdout and r, 30,
                        "the message to be flushed")
    assert latest.stdout.splitlines() == ["0\t0", "1\t25"]  # one entry: 22 header bytes + 3
    assert logbus(zk_connect, "offsets", "measured", "--time", "earliest").stdout.splitlines() == ["0\t0", "1\t0"]


def test_groups_describe_shows_committed_offsets_lag_and_owners(broker, zk_connect):
    logbus(zk_connect, "produce", "tracked", "--partition", "0", "--no-idempotence", stdin="a\nb\nc\n")
    wait_until(lambda: "0\t69" in logbus(zk_connect, "offsets", "tracked").stdout, 30, "the messages to be flushed")
    read = logbus(zk_connect, "consume", "tracked", "--group", "readers", "--from-beginning", "--count", "2")
    assert read.stdout.splitlines() == ["a", "b"]
    assert logbus(zk_connect, "groups", "list").stdout.split() == ["readers"]
    lines = logbus(zk_connect, "groups", "describe", "readers").stdout.splitlines()
    assert lines[1].split("\t")[4] == "lag_records"
    assert lines[2].split("\t") == ["tracked", "0", "46", "69", "1", "-"]  # entries of 23 bytes: "c" is left


def test_groups_describe_counts_lag_from_the_earliest_offset_once_retention_deleted_the_committed_one(
        cluster, zk_connect):
    cluster.start_broker(0, {"log.segment.bytes": 1024, "log.retention.bytes": 1024,
                             "log.retention.check.interval.ms": 100})
    logbus(zk_connect, "produce", "expiring", "--partition", "0", "--no-idempotence", stdin="a\nb\nc\n")
    read = logbus(zk_connect, "consume", "expiring", "--group", "readers", "--from-beginning", "--count", "1")
    assert read.stdout.splitlines() == ["a"]  # the group committed 23, the end of "a"
    lines = "".join(f"{i:0100d}\n" for i in range(100))  # entries of 122 bytes, 5 a request: 8 per segment
    assert logbus(zk_connect, "produce", "expiring", "--partition", "0", "--batch-size", "5", "--no-idempotence",
                  stdin=lines).returncode == 0

    def offset(time: str) -> int:
        return int(logbus(zk_connect, "offsets", "expiring", "--time", time).stdout.split()[1])

    latest = wait_until(lambda: (e := offset("latest")) == 69 + 100 * 122 and e, 30, "the messages to be flushed")
    earliest = wait_until(lambda: latest - (e := offset("earliest")) <= 1024 and e, 30,
                          "retention to bring the partition under log.retention.bytes")
    rows = [r.split("\t") for r in logbus(zk_connect, "groups", "describe", "readers").stdout.splitlines()[2:]]
    assert (latest - earliest) % 122 == 0  # what retention left: whole entries of one record each
    assert rows == [["expiring", "0", "23", str(latest), str((latest - earliest) // 122), "-"]]


def test_groups_describe_counts_records_across_batches_and_gzip_sets_and_consume_starts_inside_them(
        broker, zk_connect):
    """Offsets are per record and not dense (docs/architecture.md, "Offsets"): `consume
    --offset` at a record inside a batch or a gzip set starts exactly there, and a group
    that committed a record inside a batch lags by the records after it — neither the
    bytes to the end nor the entries."""
    produce_batch_and_gzip_set(zk_connect, "mixed")
    records = wait_visible(zk_connect, "mixed", 20)[0]
    values = [m.value.decode() for m in records]
    for first in (4, 13):  # inside the batch, inside the gzip set
        start = logbus(zk_connect, "consume", "mixed", "--partition", "0", "--offset", str(records[first].offset),
                       "--count", str(20 - first))
        assert start.stdout.splitlines() == values[first:]
    read = logbus(zk_connect, "consume", "mixed", "--group", "readers", "--from-beginning", "--count", "3")
    assert read.stdout.splitlines() == values[:3]
    rows = [r.split("\t") for r in logbus(zk_connect, "groups", "describe", "readers").stdout.splitlines()[2:]]
    committed, end = records[3].offset, records[-1].next_offset
    assert rows[0] == ["mixed", "0", str(committed), str(end), "17", "-"]
    assert end - committed != 17 and entry_count(records[3:]) == 2  # bytes, records and entries all differ


def test_groups_describe_of_an_unknown_group_fails(broker, zk_connect):
    assert_one_line_error(logbus(zk_connect, "groups", "describe", "ghosts"), "unknown group")


def test_perf_produce_and_consume_report_throughput_and_latency(broker, zk_connect):
    produced = logbus(zk_connect, "perf", "produce", "--topic", "perf", "--count", "2000", "--size", "100")
    assert produced.returncode == 0, produced.stderr
    assert "2000 records" in produced.stdout and "records/s" in produced.stdout and "p99" in produced.stdout
    consumed = logbus(zk_connect, "perf", "consume", "--topic", "perf", "--count", "2000")
    assert consumed.returncode == 0, consumed.stderr
    assert "2000 records" in consumed.stdout and "MB/s" in consumed.stdout
