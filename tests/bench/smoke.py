"""What the bench smoke tests share (`tests/bench/test_smoke*.py`, one file per group
so that pytest-xdist runs the two Spark benchmarks beside the rest). Benchmarks that
keep working (issue 25): every `bench/` module runs at a tiny size as
`python -m bench.<module>` and must exit 0, print its measurement lines and leave
nothing behind; a benchmark that fails must exit non-zero at once, having stopped what
it started. No time is asserted (speed lives in `bench/` and BENCHMARKS.md): the
timeouts only tell a hang from a slow machine.

Left behind is checked two ways that hold on a machine shared with other runs:

- scratch directories: the benchmark runs with TMPDIR (Python's `tempfile`) and
  SPARK_LOCAL_DIRS (Spark's scratch) set to a directory of the test's own, which must
  be empty once it has exited — a glob over /tmp would see other people's runs;
- processes: the benchmark's environment carries a token of the test's own, which every
  process it starts inherits — ZooKeeper, brokers, Spark's JVM and Python workers,
  multiprocessing children — also those started in a session of their own (the
  harness starts servers so), which a process-group check would miss. No process with
  the token may outlive the benchmark (after a short grace for the last exits).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOKEN = "LOGBUS_BENCH_SMOKE_TOKEN"
GRACE = 10.0  # seconds for the benchmark's last processes to be gone after it exits


@dataclass
class Smoke:
    """One benchmark at a tiny size, and what it must print (regular expressions, one
    per measurement line; `{tmp}` in the arguments is the test's scratch directory)."""

    args: list[str]
    prints: list[str]
    timeout: float = 180


SMOKES: dict[str, Smoke] = {
    "clients": Smoke(["--count", "500", "--send", "--send-many"], [
        r"producer batch 1 acks 0 +\d+ +[\d.]+ +50000 +[\d.]+",
        r"producer batch 50 acks 0 send +\d+ +[\d.]+ +400000 +[\d.]+ +[\d.]+",
        r"producer batch 50 acks 1 send_many +\d+ +[\d.]+ +400000 +[\d.]+ +[\d.]+",
        r"producer batch 50 acks 1 +\d+ +[\d.]+ +400000 +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+$",
        r"consumer \(one partition, 1 MiB fetches\) +\d+ +[\d.]+ +22000 +[\d.]+"]),
    "clients:against-raw": Smoke(["--count", "500", "--against-raw", "1"], [
        r"^raw batch 1 +\d+$",
        r"^producer/raw batch 50 +[\d.]+$",
        r"^producer CPU us/msg batch 50 +[\d.]+$",
        r"^producer 50 a call/raw batch 50 +[\d.]+$"]),
    "clients:gc-rounds": Smoke(["--count", "500", "--gc-rounds", "1"], [
        r"^round 1 batch 50: +\d+ msg/s, CPU +[\d.]+ us/msg, GC +[\d.]+ us/msg, collections \[\d+, \d+, \d+\]$"]),
    "kafka_clients": Smoke(["--records", "2000", "--rounds", "1"], [
        r"^\| native raw batch 50, acks=0 \| [\d,]+ \| \| \| 1.00 \| \|$",
        r"^\| librdkafka producer acks=1 \| [\d,]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| 300,000 \|$",
        r"^\| librdkafka producer acks=all \| [\d,]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| 300,000 \|$",
        r"^\| librdkafka producer acks=all idempotent \| [\d,]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| 300,000 \|$",
        r"^\| librdkafka consumer \| [\d,]+ \| [\d.]+ \| [\d.]+ \| — \| 500,000 \|$"]),
    "producer_ab": Smoke(["--arm", f"{REPO}:send", "--arm", f"{REPO}:produce", "--count", "300", "--rounds", "2",
                          "--batch", "1"], [
        r"^round 2 \S+ send: [\d,]+ msg/s, [\d.]+ CPU us/msg$",
        r"^\S+ produce: [\d,]+ msg/s, [\d.]+ CPU us/msg$"]),
    "raw": Smoke(["--messages", "2000"], [
        r"produce batch  1, acks=0: +[\d,]+ msg/s",
        r"\| produce batch 50 \| [\d,]+ \| [\d.]+ \| 400,000 \| [\d.]+ \|",
        r"\| consume \| [\d,]+ \| [\d.]+ \| 22,000 \| [\d.]+ \|"]),
    "range_read": Smoke(["--count", "2000", "--repeat", "1"], [
        r"read_range of 2000 messages",
        r"current +8Mi +\d+ +[\d.]+ \([\d.]+-[\d.]+\) +\d+ +\d+ +\{",
        r"current +1Mi +\d+ +[\d.]+ \([\d.]+-[\d.]+\) +\d+ +\d+ +\{"]),
    "replication": Smoke(["--count", "300", "--count-1k", "200", "--partition-count", "200",
                          "--partition-counts", "1,4", "--rate", "200", "--seconds", "0.5",
                          "--out", "{tmp}/out", "--plots", "none"], [
        r" 200 B rf=3 acks=-1: +[\d,]+ msg/s",
        r"1024 B rf=1 acks= 1: +[\d,]+ msg/s",
        r" 4 partitions rf=3 acks=-1: +[\d,]+ msg/s",
        r"latency rf=3 acks=-1 at 200 msg/s: p50 [\d.]+ ms, p99 [\d.]+ ms"], timeout=240),
    "replica_idle": Smoke(["--code", f"current={REPO}", "--partitions", "3,6", "--seconds", "1"], [
        r" 3 partitions: \d+ connections between brokers, brokers' CPU [\d.]+% of one core while idle",
        r" 6 partitions: \d+ connections between brokers, brokers' CPU [\d.]+% of one core while idle"]),
    "send_latency": Smoke(["--count", "2000", "--seconds", "0.3"], [
        r"async send\(\) latency, 200-byte messages, acks=1, maximum [\d,]+ msg/s",
        r"^ +1% +[\d,]+ +\d+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +\d+ +[\d.]+$",
        r"^ +100% +[\d,]+ +\d+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +\d+ +[\d.]+$",
        r"^ +2000 +[\d,]+ +\d+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +\d+ +[\d.]+$",
        r"^ +2000 no-op +[\d,]+ +\d+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +\d+ +[\d.]+$"]),
    "spark_load": Smoke(["--messages", "500", "--s3"], [
        r"500 messages, [\d.]+ MB in the broker",
        r"plain Spark from JSON-lines +[\d.]+ s +[\d,]+ messages/s +\(500 rows\)",
        r"load job from logbus +[\d.]+ s +[\d,]+ messages/s +\(500 rows\)",
        r"load job into S3 +[\d.]+ s +[\d,]+ messages/s +\(500 rows\)",
        r"ratio logbus / plain = [\d.]+", r"ratio S3 / local = [\d.]+"], timeout=300),
    "iceberg": Smoke(["--messages", "500", "--files", "2", "--snapshots", "2,3", "--hours", "3",
                      "--spark-timeout", "120", "--results", "{tmp}/results"], [
        r"run 1 directory +load +[\d.]+ s +commit +[\d.]+ s +total +[\d.]+ s",
        r"run 1 iceberg +load +[\d.]+ s +commit +[\d.]+ s +total +[\d.]+ s",
        r" 2 files +run 1 +iceberg +commit +[\d.]+ s",
        r"directory spark run 1: listing \+ schema [\d.]+ s",
        r"iceberg: 3 snapshots after",
        r"merging append [\d.]+ s"], timeout=420),
    "security": Smoke(["--count", "500", "--rounds", "1", "--handshakes", "3"], [
        r"^produce +[\d,]+ +[\d,]+ +[\d.]+$",
        r"^consume +[\d,]+ +[\d,]+ +[\d.]+$",
        r"the broker's CPU per message read \(µs\): plaintext \(sendfile\) [\d.]+, TLS [\d.]+",
        r"TLS \+ SCRAM-SHA-256 [\d.]+ ms"]),
    "visibility": Smoke(["--rate", "200", "--seconds", "0.5", "--rounds", "1"], [
        r"^all-flushed +1 +[\d.]+ +[\d.]+ +[\d.]+$",
        r"^followers-flushed +-1 +[\d.]+ +[\d.]+ +[\d.]+$"], timeout=240),
    "scale": Smoke(["--partitions", "5", "--connections", "3", "--messages", "500", "--rounds", "2",
                    "--idle-seconds", "0.2"], [
        r"^ +5 +[\d.]+ +\d+ +[\d.]+ +[\d,]+ +[\d.]+ +-?[\d.]+$",
        r"^ +3 +[\d,]+ +[\d.]+ +\d+$"]),
    "idempotence": Smoke(["--count", "500", "--rounds", "1"], [
        r"^batch  1, acks  1 +\d+ +\d+ +[\d.]+$",
        r"^batch 50, acks -1 +\d+ +\d+ +[\d.]+$"]),
    "kafka_groups": Smoke(["--requests", "20", "--rounds", "1", "--members", "3"], [
        r"^heartbeat +[\d.]+ us/request$",
        r"^commit 50 partitions +[\d.]+ ms/request$",
        r"^fetch 50 partitions +[\d.]+ ms/request$",
        r"^rebalance of 3 members +[\d.]+ ms$"]),
    "arrow_headers": Smoke(["--messages", "1000", "--repeat", "2"], [
        r"^native, no headers +headers column alone +best +[\d.]+ ms",
        r"^Kafka, one header each +to_arrow +best +[\d.]+ ms"]),
    "kafka_codec": Smoke(["--rounds", "1", "--repeat", "2", "--region-mib", "0.05", "--span-max", "4096"], [
        r"^store verbatim lz4 +[\d.]+ +[\d.]+ +[\d,]+$",
        r"^convert to magic 3 zstd +[\d.]+ +[\d.]+ +[\d,]+$",
        r"^magic 3 -> v2 \(fetch of a native batch\) +[\d.]+ +[\d.]+ +[\d,]+$",
        r"^fetch cut \(\d+ KiB of magic 4\) +[\d.]+ +[\d.]+ +[\d,]+ us/region$",
        r"^span rule: zstd, identical 0-byte values: breaks from -?\d+ records a batch"]),
    "producer_state": Smoke(["--gib", "0.001", "--rounds", "1", "--segment-mib", "1"], [
        r"^clean \(snapshot at the end\) +median +[\d.]+ s",
        r"^kill -9, no snapshots \(full scan\) +median +[\d.]+ s"]),
    "index_costs": Smoke(["--sets", "50", "--rounds", "1"], [
        r"^append plain batch 50 +median +[\d.]+ us/set",
        r"^FETCH v1 read at a record inside +median +[\d.]+ us"]),
    "producer_costs": Smoke(["--messages", "2000", "--rounds", "1"], [
        r"^append \+ encode +min +\d+ median +\d+$",
        r"^encoded as appended \(the alternative\) +min +\d+ median +\d+$",
        r"^floor: crc32c of 200 bytes +min +-?\d+ median +-?\d+$"]),
    "request_path": Smoke(["--requests", "200", "--rounds", "1"], [
        r"^produce batch  1 acks 0 min +[\d.]+ median +[\d.]+ us/request",
        r"^produce batch 50 acks 1 min +[\d.]+ median +[\d.]+ us/request"]),
    "recovery": Smoke(["--size", "0.003", "--segment-mib", "1", "--fetch-mib", "1", "--fetches", "5"], [
        r"\| recovery after kill -9, sidecars kept: start to logs loaded \| [\d.]+ s \|",
        r"\| recovery after kill -9, sidecars deleted: then RECORD_COUNT of the partition \| [\d.]+ s \|",
        r"\| recovery after kill -9, sidecars deleted: .index sidecars at the end \| [1-9]\d* \|",
        r"\| bytes on disk per message: index sidecars \| [\d.]+ \|",
        r"\| FETCH v1 at a record inside a batch \(median ms\) \| [\d.]+ \|"]),
    "mirror": Smoke(["--messages", "2000", "--rounds", "1"], [
        r"partition\(s\): mirror +\d+ msg/s +consumer->producer loop +\d+ msg/s",
        r"end-to-end lag through the mirror"], timeout=240),
    "mirror_lag": Smoke(["--rate", "200", "--seconds", "1", "--flush-ms", "20", "--linger-ms", "5", "--messages",
                         "2000"], [
        r"^ +20 +5 +\d+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+$",
        r"^both sources up +west +\d+ msg/s +both +\d+ msg/s$",
        r"^east stopped \(SIGSTOP\) +west +\d+ msg/s$"], timeout=240),
    "spark_stages": Smoke(["--messages", "500", "--rounds", "1"], [
        r"^round 1 logbus data source +[\d.]+ s$",
        r"^round 1 the whole run_load +[\d.]+ s$",
        r"^round 1 decoded -> pyarrow writer \(logbus-parquet\) +[\d.]+ s$",
        r"^round 1 plain Spark: read and parse the file +[\d.]+ s$"], timeout=300),
    "maintenance": Smoke(["--checkpoints", "24", "--files", "2", "--rows", "5"], [
        r"^\| 24 \| maintained \| 1\.000 \| ",
        r"^\| 24 \| never \| 2\.000 \| "]),
    "commit_transaction": Smoke(["--batches", "4", "--checkpoints", "4"], [
        r"^ +4 +[\d.]+ s +[\d.]+ s +[\d.]+$", r"both tables: 3200 rows, 4 batch records"]),
    "registry": Smoke(["--requests", "40", "--threads", "1"], [
        r"^threads=1: GET /schemas/ids [\d,]+/s, GET latest [\d,]+/s, register known [\d,]+/s, register new [\d,]+/s$",
        r"^executor writer-schema lookups: with the cache [\d,]+/s, without [\d,]+/s$"]),
    "avro_decode": Smoke(["--messages", "500", "--rounds", "1", "--repeat", "1"], [
        r"^500 records: JSON 200 bytes, framed Avro \d+ bytes a record$",
        r"^decode alone: Avro decode_value \(per value\) +[\d,]+ records/s$",
        r"^decode alone: JSON parse_values \(pyarrow\) +[\d,]+ records/s$",
        r"^whole load, local\[1\]: json +[\d.]+ s +[\d,]+ records/s$",
        r"^whole load, local\[1\]: confluent +[\d.]+ s +[\d,]+ records/s$",
        r"^ratio Avro / JSON, whole load = [\d.]+$"], timeout=420),
    "ui_page": Smoke(["--batches", "4", "--rounds", "1"], [
        r"^directory +hours, last 48 h +[\d.]+ +[\d.]+ +[\d,]+$",
        r"^iceberg +hours, all 4 h +[\d.]+ +[\d.]+ +[\d,]+$",
        r"^iceberg +lag +[\d.]+ +[\d.]+ +[\d,]+$"]),
    "broker_counts": Smoke(["--messages", "20000", "--rounds", "1"], [
        r"^\| plain entries \| [\d,]+ \|$",
        r"^the tally on the produce path: \d+ ns an append \(Tally.note\)$",
        r"^\| ratio on / off \| [\d.]+ \|$",
        r"^\| produced and flushed \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$",
        r"^counts cover every record [\d.]+ s after the last append \(median\)$"]),
    "fuzz": Smoke(["--cases", "40", "--seed", "25", "--check-every", "10"], [
        r"^40 cases in [\d.]+s: \d+ answered, \d+ closed without an answer; crashes 0; "
        r"control worst wait \d+ ms; fuzz topic holds \d+ readable messages$"]),
    "paper": Smoke(["--messages", "2000", "--peers", "none", "--skip-install", "--latency-rate", "200",
                    "--latency-seconds", "1", "--latency-flush-ms", "20", "--results", "{tmp}/results",
                    "--plots", "none"], [
        r"^\| logbus \| batch 1, acks=0 \| 2,000 \| [\d,]+ \| [\d.]+ \| 50,000 \| [\d.]+ \|$",
        r"^\| logbus \| batch 50, acks=1 \| 2,000 \| [\d,]+ \| [\d.]+ \| 400,000 \| [\d.]+ \|$",
        r"^\| logbus \| batch 1, acks=1, idempotent \| 2,000 \| [\d,]+ \| [\d.]+ \| 50,000 \| [\d.]+ \|$",
        r"^\| logbus \| batch 50, acks=0, 50 a call \| 2,000 \| [\d,]+ \| [\d.]+ \| 400,000 \| [\d.]+ \|$",
        r"^\| logbus \| batch 50, acks=1, idempotent, 50 a call \| 2,000 \| [\d,]+ \| [\d.]+ \| 400,000 \| [\d.]+ \|$",
        r"^\| logbus \| fetch 200 KB \| 2,000 \| [\d,]+ \| [\d.]+ \| 22,000 \| [\d.]+ \|$",
        r"^\| logbus \(librdkafka\) \| linger 5 ms, batch.size 1 MB, acks=1 \| 2,000 \| [\d,]+ \| [\d.]+ \| — \| — \|$",
        r"^\| logbus \(librdkafka\) \| fetch 200 KB \| 2,000 \| [\d,]+ \| [\d.]+ \| 22,000 \| [\d.]+ \|$",
        r"^\| logbus \| 2,000 \| [\d,]+ \| [\d.]+ \| 9 \|",
        r"^\| 20 \| 200 \| \d+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$"]),
}


@dataclass
class Run:
    code: int
    output: str
    seconds: float


def marked(token: str) -> list[int]:
    """The live processes whose environment holds `token`."""
    needle = f"{TOKEN}={token}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                pass
    return pids


def describe(pids: list[int]) -> str:
    lines = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            lines.append(f"{pid}: {command[:200]}")
        except OSError:
            pass
    return "\n".join(lines)


def run_bench(module: str, args: list[str], scratch: Path, timeout: float, env: dict[str, str] | None = None,
              watch: str | None = None, after_watch: float | None = None, terminate: bool = False) -> Run:
    """`python -m bench.<module> args` with its own TMPDIR and token; fails the test when
    it outlives `timeout` (or `after_watch` seconds after printing `watch`, SIGTERM sent
    then with `terminate`), leaves a process or a file in its TMPDIR. Output goes to a
    file, not a pipe, whose end would wait for every process holding it."""
    tmp = scratch / "tmp"
    tmp.mkdir()
    token = uuid.uuid4().hex
    log = scratch / "output.txt"
    environment = {**os.environ, "TMPDIR": str(tmp), "SPARK_LOCAL_DIRS": str(tmp), TOKEN: token,
                   "PYTHONUNBUFFERED": "1", **(env or {})}
    start = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", f"bench.{module}", *args], cwd=REPO, env=environment,
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    hang = None
    seen = None
    while process.poll() is None and hang is None:
        time.sleep(0.2)
        now = time.monotonic()
        if seen is None and watch is not None and watch in log.read_text(errors="replace"):
            seen = now
            if terminate:
                process.terminate()
        if now - start > timeout:
            hang = f"did not exit within {timeout:.0f} s"
        elif seen is not None and now - seen > after_watch:
            hang = f"did not exit within {after_watch:.0f} s of printing {watch!r}"
    seconds = time.monotonic() - start
    if hang:
        process.kill()
        process.wait()
    deadline = time.monotonic() + GRACE
    while (left := marked(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:  # not to leak them into the rest of the run
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    output = log.read_text(errors="replace")
    assert hang is None, f"bench.{module} {hang}; its output:\n{output[-4000:]}"
    assert not left, f"bench.{module} left processes running:\n{describe(left)}\n\nits output:\n{output[-4000:]}"
    leftovers = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))
    assert not leftovers, f"bench.{module} left files in its TMPDIR: {leftovers[:20]}"
    return Run(process.returncode, output, seconds)


def check_runs_at_a_tiny_size(name: str, tmp_path: Path) -> None:
    """`name` is a module, or `module:mode` for a second way to run one."""
    smoke = SMOKES[name]
    module = name.split(":")[0]
    args = [a.replace("{tmp}", str(tmp_path)) for a in smoke.args]
    run = run_bench(module, args, tmp_path, smoke.timeout)
    assert run.code == 0, f"bench.{module} exited with {run.code}:\n{run.output[-4000:]}"
    missing = [p for p in smoke.prints if not re.search(p, run.output, re.MULTILINE)]
    assert not missing, f"bench.{module} did not print {missing}; its output:\n{run.output[-4000:]}"
    print(f"bench.{module}: {run.seconds:.1f} s")


def timed(modules: list[str], long: tuple[str, ...] = ()) -> list:
    """`modules` as parameters, each with a pytest timeout past its own; those in `long`
    run in `make test-long` only."""
    return [pytest.param(m, marks=[pytest.mark.timeout(SMOKES[m].timeout + 60)]
                         + ([pytest.mark.long] if m in long else [])) for m in modules]
