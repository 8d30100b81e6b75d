"""Size-prefixed frames read from a raw socket, for tests and benchmarks that speak a
broker's wire protocol by hand (native or Kafka: both prefix each frame with a 4-byte
big-endian size)."""

from __future__ import annotations

import socket
import struct


def read_exactly(sock: socket.socket, n: int) -> bytes:
    """`n` bytes; ConnectionError if the broker closes first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


def read_frame(sock: socket.socket) -> bytes:
    """The next frame's bytes after its size."""
    return read_exactly(sock, struct.unpack(">i", read_exactly(sock, 4))[0])
