"""The TCP sockets a process tree holds, from /proc (Linux): which servers a test started
are reachable from outside the machine, and how many connections a process keeps to a
port."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"
ESTABLISHED = "01"


@dataclass(frozen=True)
class Listener:
    pid: int
    command: str
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        out.add(pid)
        todo.extend(children.get(pid, []))
    return out


def _decode(hex_address: str) -> tuple[str, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        address = str(ipaddress.IPv4Address(raw[::-1]))
    else:  # four 32-bit words, each in host (little-endian) order
        address = str(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))
    return address, int(port, 16)


def _inodes(state: str, local: bool) -> dict[str, tuple[str, int]]:
    """Socket inode -> (address, port) of every TCP socket in `state`: its local end,
    or its remote end."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == state:
                out[fields[9]] = _decode(fields[1] if local else fields[2])
    return out


def _socket_inodes(pid: int) -> list[str]:
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.append(target[8:-1])
    return found


def connections_to(port: int, root: int) -> int:
    """Established TCP connections that `root` or its descendants hold to `port`."""
    remote = _inodes(ESTABLISHED, local=False)
    count = 0
    for pid in descendants(root):
        try:
            count += sum(1 for inode in _socket_inodes(pid) if remote.get(inode, ("", -1))[1] == port)
        except OSError:
            continue
    return count


def listeners(root: int | None = None) -> list[Listener]:
    """Every LISTEN socket held by `root` (default: this process) or its descendants."""
    inodes = _inodes(LISTEN, local=True)
    found = []
    for pid in descendants(root or os.getpid()):
        try:
            sockets = _socket_inodes(pid)
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for inode in sockets:
            if inode in inodes:
                address, port = inodes[inode]
                found.append(Listener(pid, command, address, port))
    return found
