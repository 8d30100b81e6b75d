"""ActiveMQ (Classic) from Debian's package, run from its jar with a copied
configuration in a scratch directory: the default KahaDB store, the default
OpenWire connector and a STOMP connector on free loopback ports; driven with stomp.py.

Persistent messages (`persistent:true`) to a queue, without receipts (the client
does not wait per message); the end of a run is one send with a receipt — STOMP
frames on a connection are handled in order. The consumer subscribes with
`ack:auto` and `activemq.prefetchSize:1000`.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path

from bench.peers.base import PeerServer, ensure_debian_packages, free_port, port_open

ACTIVEMQ_HOME = Path("/usr/share/activemq")
ACTIVEMQ_JAR = ACTIVEMQ_HOME / "bin" / "activemq.jar"
DEBIAN_CONFIG = Path("/etc/activemq/instances-available/main")
QUEUE = "/queue/paper-bench"
JAVA_OPENS = [
    "--add-reads=java.xml=java.logging",
    *(f"--add-opens={m}=ALL-UNNAMED" for m in (
        "java.base/java.security", "java.base/java.net", "java.base/java.lang", "java.base/java.util",
        "java.naming/javax.naming.spi", "java.rmi/sun.rmi.transport.tcp", "java.base/java.util.concurrent",
        "java.base/java.util.concurrent.atomic")),
]


def install() -> None:
    ensure_debian_packages(["activemq"], lambda: ACTIVEMQ_JAR.exists() and shutil.which("java") is not None)


class ActiveMQServer(PeerServer):
    name = "activemq"

    def __init__(self, workdir: Path, heap: str = "1g") -> None:
        super().__init__(workdir)
        self.port = free_port()  # STOMP
        self.openwire_port = free_port()
        self.heap = heap
        self.conf = self.workdir / "conf"
        self.data = self.workdir / "data"

    def _write_config(self) -> None:
        self.conf.mkdir(exist_ok=True)
        self.data.mkdir(exist_ok=True)
        xml = (DEBIAN_CONFIG / "activemq.xml").read_text()
        connectors = (
            "<transportConnectors>\n"
            f'            <transportConnector name="openwire" uri="tcp://127.0.0.1:{self.openwire_port}"/>\n'
            f'            <transportConnector name="stomp" uri="stomp://127.0.0.1:{self.port}"/>\n'
            "        </transportConnectors>"
        )
        xml, n = re.subn(r"<transportConnectors>.*?</transportConnectors>", connectors, xml, flags=re.S)
        if n != 1:
            raise RuntimeError(f"unexpected ActiveMQ configuration in {DEBIAN_CONFIG}: no transportConnectors")
        (self.conf / "activemq.xml").write_text(xml)
        shutil.copy(DEBIAN_CONFIG / "log4j2.properties", self.conf / "log4j2.properties")

    def command(self) -> list[str]:
        self._write_config()
        java = shutil.which("java") or "java"
        return [
            java, f"-Xms{self.heap}", f"-Xmx{self.heap}", *JAVA_OPENS,
            f"-Dactivemq.classpath={ACTIVEMQ_HOME / 'lib'}/", f"-Dactivemq.home={ACTIVEMQ_HOME}",
            f"-Dactivemq.base={self.workdir}", f"-Dactivemq.conf={self.conf}", f"-Dactivemq.data={self.data}",
            f"-Dlog4j2.configurationFile={self.conf / 'log4j2.properties'}",
            "-jar", str(ACTIVEMQ_JAR), "start", f"xbean:file:{self.conf / 'activemq.xml'}",
        ]

    def environment(self) -> dict[str, str]:
        return {**os.environ, "ACTIVEMQ_BASE": str(self.workdir)}

    def ready(self) -> bool:
        return port_open(self.port) and port_open(self.openwire_port)

    def data_dir(self) -> Path:
        return self.data / "kahadb"


class _Listener:
    """stomp.py calls `on_message` in its receiver thread."""

    def __init__(self, sampler, expected: int) -> None:
        self.sampler = sampler
        self.expected = expected
        self.got = 0
        self.done = threading.Event()
        self.receipts: set[str] = set()
        self.receipt_event = threading.Event()
        self.errors: list[str] = []

    def on_message(self, frame) -> None:
        self.got += 1
        if self.got % self.sampler.every == 0:
            self.sampler.tick(self.sampler.every)
        if self.got >= self.expected:
            self.done.set()

    def on_receipt(self, frame) -> None:
        self.receipts.add(frame.headers.get("receipt-id"))
        self.receipt_event.set()

    def on_error(self, frame) -> None:
        self.errors.append(f"{frame.headers.get('message')}: {frame.body!r}")
        self.done.set()
        self.receipt_event.set()

    def on_disconnected(self) -> None:
        self.done.set()
        self.receipt_event.set()


def _connect(server: ActiveMQServer, listener: _Listener):
    import stomp  # noqa: PLC0415 - optional dependency of the bench extra

    conn = stomp.Connection([("127.0.0.1", server.port)], heartbeats=(0, 0), auto_content_length=True)
    conn.set_listener("bench", listener)
    conn.connect(wait=True)
    return conn


def produce(server: ActiveMQServer, messages: int, payload: bytes, sampler) -> None:
    listener = _Listener(sampler, 0)
    conn = _connect(server, listener)
    try:
        headers = {"persistent": "true"}
        send = conn.send
        sampler.start()
        for chunk in sampler.chunks(messages):
            for _ in range(chunk):
                send(QUEUE, payload, headers=headers)
            sampler.tick(chunk)
        send(QUEUE, b"end", headers={"persistent": "true", "receipt": "end"})
        if not listener.receipt_event.wait(300) or "end" not in listener.receipts:
            raise RuntimeError(f"ActiveMQ did not confirm the end of the run: {listener.errors}")
        sampler.finish()
    finally:
        conn.disconnect()


def consume(server: ActiveMQServer, messages: int, sampler, prefetch: int = 1000) -> int:
    """Read `messages` (+1: the end marker of `produce`)."""
    listener = _Listener(sampler, messages + 1)
    conn = _connect(server, listener)
    try:
        sampler.start()
        conn.subscribe(QUEUE, id="1", ack="auto", headers={"activemq.prefetchSize": str(prefetch)})
        if not listener.done.wait(3600):
            raise RuntimeError("ActiveMQ consumer timed out")
        got = min(listener.got, messages)
        sampler.tick(got % sampler.every)
        sampler.finish()
        if listener.errors:
            raise RuntimeError(f"ActiveMQ: {listener.errors}")
    finally:
        conn.disconnect()
    return got
