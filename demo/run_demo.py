"""`make demo` (broker stage): start ZooKeeper and a broker from nothing, produce and
fetch a few messages, print them, stop everything. The provider issue grows this into
the full hourly warehouse load."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.client.connection import BrokerConnection  # noqa: E402
from broker.localcluster import LocalCluster, ZooKeeperServer  # noqa: E402
from broker.message import encode_message_set, iter_messages  # noqa: E402


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="logbus-demo-") as workdir:
        with ZooKeeperServer(Path(workdir) / "zookeeper") as zk, LocalCluster(zk.connect_string + "/demo", Path(workdir)) as cluster:
            broker = cluster.start_broker(0, {"log.flush.interval.ms": 50})
            print(f"ZooKeeper at {zk.connect_string}, broker 0 at 127.0.0.1:{broker.port}")
            with BrokerConnection(*broker.address, client_id="demo") as conn:
                conn.create_topic("page_views", 1)
                events = [(None, b'{"page": "/home", "user": %d}' % i, None) for i in range(5)]
                result = conn.produce("page_views", 0, encode_message_set(events), acks=-1)
                print(f"produced 5 messages at offsets [{result.base_offset}, {result.next_offset})")
                response = conn.fetch("page_views", 0, 0)
                for message in iter_messages(response.messages, 0):
                    print(f"  offset {message.offset:>4}  next {message.next_offset:>4}  {message.value.decode()}")
    print("stopped ZooKeeper and the broker")
    return 0


if __name__ == "__main__":
    sys.exit(main())
