"""Results of a paper run as CSV, Markdown tables and the two figures."""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass, field
from pathlib import Path

# The paper's figures (NetDB 2011, §4): Kafka 0.7 producer at batch 1 and 50, consumer;
# the peers only as the text bounds them ("at least 2 times higher than RabbitMQ",
# "orders of magnitude higher than ActiveMQ", consumer "more than 4 times" both).
PAPER_PRODUCE = {1: 50_000, 50: 400_000}
PAPER_CONSUME = 22_000
PAPER_OVERHEAD = {"logbus": 9, "ActiveMQ": 144}


@dataclass
class Run:
    system: str  # "logbus", "RabbitMQ", "ActiveMQ", "Redis Streams"
    test: str  # "produce" or "consume"
    setting: str  # e.g. "batch 50, acks=0"
    messages: int
    seconds: float
    series: list[tuple[float, float]] = field(default_factory=list)
    batch: int = 1
    notes: str = ""

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def label(self) -> str:
        return f"{self.system} ({self.setting})" if self.setting else self.system


@dataclass
class Storage:
    system: str
    messages: int
    bytes_on_disk: int
    payload: int = 200

    @property
    def per_message(self) -> float:
        return self.bytes_on_disk / self.messages - self.payload


@dataclass
class Latency:
    flush_ms: int
    rate: int
    values: list[float]

    def q(self, p: float) -> float:
        v = sorted(self.values)
        return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")


def write_csv(out: Path, runs: list[Run], storage: list[Storage], latencies: list[Latency]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "throughput.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["system", "test", "setting", "messages", "seconds", "msg_per_s", "mb_per_s_payload", "notes"])
        for r in runs:
            w.writerow([r.system, r.test, r.setting, r.messages, f"{r.seconds:.3f}", f"{r.rate:.0f}",
                        f"{r.rate * 200 / 1e6:.2f}", r.notes])
    with open(out / "series.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["system", "test", "setting", "mb_sent", "msg_per_s"])
        for r in runs:
            for mb, rate in r.series:
                w.writerow([r.system, r.test, r.setting, f"{mb:.1f}", f"{rate:.0f}"])
    with open(out / "storage.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["system", "messages", "bytes_on_disk", "bytes_per_message_beyond_payload"])
        for s in storage:
            w.writerow([s.system, s.messages, s.bytes_on_disk, f"{s.per_message:.1f}"])
    with open(out / "latency.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["flush_interval_ms", "rate_msg_per_s", "messages", "median_ms", "p99_ms", "max_ms"])
        for lat in latencies:
            w.writerow([lat.flush_ms, lat.rate, len(lat.values), f"{lat.q(0.5):.1f}", f"{lat.q(0.99):.1f}",
                        f"{max(lat.values, default=float('nan')):.1f}"])


def _ratio(a: float, b: float | None) -> str:
    return f"{a / b:.2f}" if b else "—"


def markdown(runs: list[Run], storage: list[Storage], latencies: list[Latency]) -> str:
    peers = [r for r in runs if not r.system.startswith("logbus")]  # "logbus (librdkafka)" is ours
    peer_names = list(dict.fromkeys(r.system for r in peers))
    lines: list[str] = []
    for test, title in (("produce", "Producer test"), ("consume", "Consumer test")):
        ours = [r for r in runs if r.system.startswith("logbus") and r.test == test]
        theirs = {r.system: r for r in peers if r.test == test}
        lines += [f"### {title}", ""]
        head = "| system | setting | messages | msg/s | MB/s | paper msg/s | ours / paper |"
        head += "".join(f" logbus / {p} |" for p in peer_names)
        lines += [head, "|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(peer_names)]
        for r in ours + [theirs[p] for p in peer_names if p in theirs]:
            paper = ((PAPER_PRODUCE.get(r.batch) if test == "produce" else PAPER_CONSUME)
                     if r.system.startswith("logbus") else None)
            row = (f"| {r.system} | {r.setting} | {r.messages:,} | {r.rate:,.0f} | {r.rate * 200 / 1e6:.1f} | "
                   f"{f'{paper:,}' if paper else '—'} | {_ratio(r.rate, paper)} |")
            for p in peer_names:
                row += f" {_ratio(r.rate, theirs[p].rate) if r.system.startswith('logbus') and p in theirs else '—'} |"
            lines.append(row)
        lines.append("")
    if storage:
        by = {s.system: s for s in storage}
        amq = by.get("ActiveMQ")
        lines += ["### Storage overhead", "",
                  "| system | messages | bytes on disk | bytes per message beyond the 200-byte payload | paper | ours / paper | / ActiveMQ |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for s in storage:
            paper = PAPER_OVERHEAD.get(s.system)
            lines.append(f"| {s.system} | {s.messages:,} | {s.bytes_on_disk:,} | {s.per_message:.1f} | "
                         f"{paper if paper else '—'} | {_ratio(s.per_message, paper)} | "
                         f"{_ratio(s.per_message, amq.per_message if amq else None)} |")
        lines.append("")
    if latencies:
        lines += ["### logbus end-to-end latency", "",
                  "| log.flush.interval.ms | rate msg/s | messages | median ms | p99 ms | max ms |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for lat in latencies:
            lines.append(f"| {lat.flush_ms} | {lat.rate:,} | {len(lat.values):,} | {lat.q(0.5):.1f} | "
                         f"{lat.q(0.99):.1f} | {max(lat.values, default=float('nan')):.1f} |")
        lines.append("")
    return "\n".join(lines)


PAPER_REFERENCE = {
    "produce": ((50_000, "paper, Kafka batch 1: 50,000"), (400_000, "paper, Kafka batch 50: 400,000")),
    "consume": ((22_000, "paper, Kafka: 22,000"),),
}

_STYLE = {
    "logbus": ("tab:blue", "-"), "RabbitMQ": ("tab:orange", "-"), "ActiveMQ": ("tab:red", "-"),
    "Redis Streams": ("tab:green", "-"), "logbus (librdkafka)": ("tab:cyan", "-"),
}


def plot(runs: list[Run], test: str, path: Path, title: str) -> None:
    import matplotlib  # noqa: PLC0415 - optional dependency of the bench extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(12, 5.5), dpi=110)
    markers = iter("osD^v<>ph*")
    for r in runs:
        if r.test != test or not r.series:
            continue
        color, _ = _STYLE.get(r.system, ("black", "-"))
        style = "--" if "acks=1" in r.setting else "-"
        if r.system == "logbus" and r.setting.startswith("batch 1,"):
            color = "tab:purple"
        xs, ys = zip(*r.series)
        ax.plot(xs, ys, style, color=color, marker=next(markers), markersize=4, linewidth=1.6,
                label=f"{r.label}: {r.rate:,.0f} msg/s")
    for value, text in (PAPER_REFERENCE.get(test) or ()):
        ax.axhline(value, color="gray", linestyle=":", linewidth=1.2)
        ax.annotate(text, (0.005, value), xycoords=("axes fraction", "data"), fontsize=7, color="dimgray",
                    va="bottom")
    ax.set_yscale("log")
    ax.set_xlabel("data sent (MB)" if test == "produce" else "data consumed (MB)")
    ax.set_ylabel("throughput (messages/s, log scale)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def median_rate(run: Run) -> float:
    return statistics.median(rate for _, rate in run.series) if run.series else run.rate


def load_runs(results: Path) -> list[Run]:
    """The runs of a finished `bench.paper` from its CSV files (to redraw the plots)."""
    runs: dict[tuple[str, str, str], Run] = {}
    with open(results / "throughput.csv", newline="") as f:
        for row in csv.DictReader(f):
            batch = int(row["setting"].split(",")[0].split()[1]) if row["setting"].startswith("batch ") else 1
            runs[(row["system"], row["test"], row["setting"])] = Run(
                row["system"], row["test"], row["setting"], int(row["messages"]), float(row["seconds"]),
                batch=batch, notes=row["notes"])
    with open(results / "series.csv", newline="") as f:
        for row in csv.DictReader(f):
            runs[(row["system"], row["test"], row["setting"])].series.append(
                (float(row["mb_sent"]), float(row["msg_per_s"])))
    return list(runs.values())


def draw(runs: list[Run], plots: Path) -> None:
    plot(runs, "produce", plots / "producer.png", "Producer performance (after the paper's Figure 4), 200-byte messages")
    plot(runs, "consume", plots / "consumer.png", "Consumer performance (after the paper's Figure 5), 200-byte messages")


if __name__ == "__main__":  # redraw: python -m bench.paper.report [results dir] [plots dir]
    import sys

    root = Path(__file__).resolve().parents[2]
    draw(load_runs(Path(sys.argv[1]) if len(sys.argv) > 1 else root / "bench" / "results"),
         Path(sys.argv[2]) if len(sys.argv) > 2 else root / "bench" / "plots")
