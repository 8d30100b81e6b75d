"""Redis Streams, a modern peer: Debian's redis-server in a scratch directory on a
free port, with the append-only file on and `appendfsync everysec` (its durable
setting closest to a flush interval), RDB snapshots and AOF rewrites off (a rewrite
would compact the file into a compressed snapshot in the middle of the storage
measurement); driven with redis-py.

Producer: `XADD` of one message per entry, pipelined (`pipeline` commands per round
trip, no transaction). Consumer: `XREAD COUNT 1000` from the last id seen.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bench.peers.base import PeerServer, ensure_debian_packages, free_port

STREAM = "paper-bench"


def install() -> None:
    ensure_debian_packages(["redis-server"], lambda: shutil.which("redis-server") is not None)


class RedisServer(PeerServer):
    name = "redis"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.port = free_port()
        (self.workdir / "data").mkdir(exist_ok=True)

    def command(self) -> list[str]:
        return [
            shutil.which("redis-server") or "redis-server", "--bind", "127.0.0.1", "--port", str(self.port),
            "--dir", str(self.workdir / "data"), "--appendonly", "yes", "--appendfsync", "everysec",
            "--save", "", "--auto-aof-rewrite-percentage", "0", "--daemonize", "no", "--protected-mode", "yes", "--logfile", "",
        ]

    def client(self):
        import redis  # noqa: PLC0415 - optional dependency of the bench extra

        return redis.Redis(host="127.0.0.1", port=self.port)

    def ready(self) -> bool:
        try:
            return bool(self.client().ping())
        except Exception:
            return False

    def data_dir(self) -> Path:
        return self.workdir / "data"


def produce(server: RedisServer, messages: int, payload: bytes, sampler, pipeline: int = 50) -> None:
    r = server.client()
    fields = {b"v": payload}
    sampler.start()
    for chunk in sampler.chunks(messages):
        left = chunk
        while left:
            n = min(pipeline, left)
            pipe = r.pipeline(transaction=False)
            for _ in range(n):
                pipe.xadd(STREAM, fields)
            pipe.execute()
            left -= n
        sampler.tick(chunk)
    sampler.finish()
    r.close()


def consume(server: RedisServer, messages: int, sampler, count: int = 1000) -> int:
    r = server.client()
    last = b"0-0"
    got = pending = 0
    every = sampler.every
    sampler.start()
    while got < messages:
        answer = r.xread({STREAM: last}, count=count)
        if not answer:
            break
        entries = answer[0][1]
        last = entries[-1][0]
        got += len(entries)
        pending += len(entries)
        while pending >= every:
            sampler.tick(every)
            pending -= every
    sampler.tick(pending)
    sampler.finish()
    r.close()
    return got
