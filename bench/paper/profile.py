"""Where the time goes at the paper's batch-50 setting: py-spy on the producer
process (client side) and on the broker (produce path) while one async producer sends.

    .venv/bin/pip install py-spy
    .venv/bin/python -m bench.paper.profile --messages 1000000 --batch 50 --acks 0

Writes the raw py-spy samples and a summary (self time per function, and time
inclusive of callees) to bench/results/profile-*.txt and prints the summary.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.paper import logbus_side
from bench.paper.sampling import Sampler

ROOT = Path(__file__).resolve().parents[2]
_LINE = re.compile(r" \((.*?):\d+\)$")


def _frame(frame: str) -> str:
    """'send (broker/client/producer.py:213)' -> 'send (producer.py)'."""
    m = _LINE.search(frame)
    if not m:
        return frame
    return f"{frame[:m.start()]} ({Path(m.group(1)).name})"


def summarize(raw: Path, top: int = 25) -> str:
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))] or frames
        self_time[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    out = [f"{raw.name}: {total} samples (busy threads only)", "", "self time:"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in self_time.most_common(top)]
    out += ["", "inclusive time:"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(top)]
    return "\n".join(out)


def _producer(zookeeper: str, topic: str, messages: int, acks: int, batch: int, go, done) -> None:
    setup = type("S", (), {"zookeeper": zookeeper})()
    go.wait()
    s = Sampler("producer", messages, 50_000)
    logbus_side.produce(setup, topic, messages, b"m" * 200, s, acks=acks, batch=batch)
    done.put(s.rate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--acks", type=int, default=0)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--tag", default="", help="suffix of the output files")
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        raise SystemExit("py-spy is missing: .venv/bin/pip install py-spy")
    args.results.mkdir(parents=True, exist_ok=True)
    name = f"b{args.batch}-a{args.acks}{args.tag}"
    with tempfile.TemporaryDirectory(prefix="logbus-profile-") as scratch:
        workdir = Path(scratch)
        with logbus_side.ZooKeeperServer(workdir / "zk") as zk, \
                logbus_side.LocalCluster(zk.connect_string + "/profile", workdir / "logbus") as cluster:
            broker = cluster.start_broker(0, logbus_side.THROUGHPUT_SETTINGS)
            setup = logbus_side.LogbusSetup(zk, cluster, broker)
            topic = "profile"
            logbus_side.create_topic(setup, topic)
            ctx = multiprocessing.get_context("fork")
            go, done = ctx.Event(), ctx.Queue()
            proc = ctx.Process(target=_producer, args=(setup.zookeeper, topic, args.messages, args.acks, args.batch,
                                                      go, done))
            proc.start()
            spies = []
            for who, pid in (("client", proc.pid), ("broker", setup.pid())):
                raw = args.results / f"profile-{name}-{who}.raw"
                spies.append((who, raw, subprocess.Popen(
                    [py_spy, "record", "--nonblocking", "-r", str(args.rate), "-p", str(pid), "-f", "raw",
                     "-o", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
            time.sleep(1.0)
            go.set()
            try:
                rate = done.get(timeout=1800)
            finally:
                proc.join(30)
                for _, _, spy in spies:
                    if spy.poll() is None:
                        spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
                for _, _, spy in spies:
                    try:
                        spy.wait(30)
                    except subprocess.TimeoutExpired:
                        spy.kill()
    print(f"producer batch {args.batch}, acks={args.acks}: {rate:,.0f} msg/s under py-spy\n")
    for who, raw, _ in spies:
        text = summarize(raw)
        (args.results / f"profile-{name}-{who}.txt").write_text(text + "\n")
        print(f"== {who} ==\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
