"""RabbitMQ from Debian's package, run directly (not through systemd) in a scratch
directory as its own node on free ports, with its own epmd; driven with pika.

The paper's setting: a durable queue, persistent messages (delivery_mode=2) and no
publisher confirms — RabbitMQ writes to disk asynchronously ("asynchronous flush").
The consumer uses automatic acknowledgement and basic_qos prefetch 1000 (RabbitMQ
applies prefetch only to unacknowledged deliveries, so with auto-ack it pushes as
fast as TCP takes them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from bench.peers.base import PeerServer, ensure_debian_packages, free_port, port_open

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
QUEUE = "paper-bench"


def install() -> None:
    ensure_debian_packages(["rabbitmq-server"], RABBITMQ_SERVER.exists)


class RabbitMQServer(PeerServer):
    name = "rabbitmq"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.node = f"logbus-bench-{os.getpid()}@localhost"

    def environment(self) -> dict[str, str]:
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        config = self.workdir / "rabbitmq.conf"
        config.write_text("loopback_users = none\ndisk_free_limit.absolute = 1GB\n")
        plugins = self.workdir / "enabled_plugins"
        plugins.write_text("[].\n")
        return {
            **os.environ,
            "HOME": str(home),  # the Erlang cookie lives here
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(self.workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.workdir / "log"),
            "RABBITMQ_CONFIG_FILE": str(config),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(self.workdir / "plugins-expand"),
            "RABBITMQ_PID_FILE": str(self.workdir / "rabbitmq.pid"),
            "RABBITMQ_ALLOW_INPUT": "",
        }

    def command(self) -> list[str]:
        return [str(RABBITMQ_SERVER)]

    def ready(self) -> bool:
        if not port_open(self.port):
            return False
        import pika  # noqa: PLC0415 - optional dependency of the bench extra

        try:
            pika.BlockingConnection(self.parameters()).close()
            return True
        except Exception:
            return False

    def data_dir(self) -> Path:
        return self.workdir / "mnesia"

    def after_stop(self) -> None:
        epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
        subprocess.run([epmd, "-port", str(self.epmd_port), "-kill"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env={**os.environ, "ERL_EPMD_PORT": str(self.epmd_port)},
                       timeout=10, check=False)

    def parameters(self):
        import pika  # noqa: PLC0415

        return pika.ConnectionParameters("127.0.0.1", self.port, credentials=pika.PlainCredentials("guest", "guest"),
                                         heartbeat=0, blocked_connection_timeout=300)


def produce(server: RabbitMQServer, messages: int, payload: bytes, sampler) -> None:
    import pika  # noqa: PLC0415

    conn = pika.BlockingConnection(server.parameters())
    try:
        channel = conn.channel()
        channel.queue_declare(QUEUE, durable=True)
        props = pika.BasicProperties(delivery_mode=2)
        publish = channel.basic_publish
        sampler.start()
        for chunk in sampler.chunks(messages):
            for _ in range(chunk):
                publish("", QUEUE, payload, props)
            sampler.tick(chunk)
        # The channel handles commands in order: the answer to this declare means every
        # publish before it reached the queue.
        count = channel.queue_declare(QUEUE, durable=True, passive=True).method.message_count
        sampler.finish()
        sampler.note(f"queue holds {count:,} messages")
    finally:
        conn.close()


def consume(server: RabbitMQServer, messages: int, sampler, prefetch: int = 1000) -> int:
    conn = __import__("pika").BlockingConnection(server.parameters())
    got = 0
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=prefetch)
        every = sampler.every
        sampler.start()

        def on_message(_ch, _method, _props, body) -> None:
            nonlocal got
            got += 1
            if got % every == 0:
                sampler.tick(every)

        channel.basic_consume(QUEUE, on_message, auto_ack=True)
        idle = 0
        while got < messages and idle < 20:
            before = got
            conn.process_data_events(time_limit=0.5)
            idle = idle + 1 if got == before else 0
        sampler.tick(got % every)
        sampler.finish()
    finally:
        conn.close()
    return got
