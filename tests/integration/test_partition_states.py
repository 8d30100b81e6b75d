"""The partition-state cache brokers answer METADATA from and clients route by
(`broker.common.partitionstates`), against a real ZooKeeper through a TCP proxy that
can drop the connection while the session lives on."""

from __future__ import annotations

import threading

from kazoo.client import KazooClient, KazooState

from broker.common.partitionstates import PartitionStates
from broker.common.zklayout import PartitionState, partition_state_path
from harness.process import wait_until
from harness.proxy import TcpProxy


def test_states_follow_changes_made_after_the_connection_dropped_and_came_back(zookeeper, zk_connect, zk):
    """kazoo drops one-shot watches with the connection, session or not: a cache that
    only read again after a lost session kept a stale leader for ever (a CI failure:
    a ZooKeeper server stopped under a broker, then the controller moved leaders)."""
    path = partition_state_path("t", 0)
    zk.create(path, PartitionState(1, 0, [1, 2]).encode(), makepath=True)
    host, port = zookeeper.connect_string.split(",")[0].split(":")
    chroot = zk_connect[zk_connect.index("/"):]
    with TcpProxy((host, int(port))) as proxy:
        client = KazooClient(proxy.address + chroot, timeout=30, connection_retry={"max_tries": -1, "max_delay": 0.2})
        client.start(30)
        try:
            states = PartitionStates(client)
            states.watch("t", [0])
            assert states.get("t", 0, [1, 2]).leader == 1
            suspended, connected = threading.Event(), threading.Event()
            client.add_listener(lambda s: (suspended if s == KazooState.SUSPENDED else connected).set())
            proxy.cut()
            assert suspended.wait(30)
            connected.clear()
            proxy.restore()
            assert connected.wait(30) and client.state == KazooState.CONNECTED  # the same session
            zk.set(path, PartitionState(2, 1, [2]).encode())
            wait_until(lambda: states.get("t", 0, [1, 2]).leader == 2, 30, "the cache to see the new leader")
            zk.set(path, PartitionState(1, 2, [1, 2]).encode())  # and the watch is set again for what follows
            wait_until(lambda: states.get("t", 0, [1, 2]).leader_epoch == 2, 30, "the cache to see the next change")
            states.close()
        finally:
            client.stop()
            client.close()
