"""The harness's three-server ZooKeeper ensemble (real servers from Debian's jars):
it keeps serving with one server stopped, a restarted server catches up, and without
a majority nothing is served."""

from kazoo.client import KazooClient

from harness.process import wait_until


def client(connect_string: str) -> KazooClient:
    zk = KazooClient(connect_string, connection_retry={"max_tries": -1, "max_delay": 1})
    zk.start(30)
    return zk


def test_the_ensemble_serves_with_one_server_stopped_and_stops_without_a_majority(zookeeper_ensemble):
    ensemble = zookeeper_ensemble
    zk = client(ensemble.connect_string)
    try:
        zk.create("/before", b"1")
        leader = ensemble.leader
        assert leader is not None
        ensemble.stop_server(leader)
        wait_until(lambda: ensemble.leader not in (None, leader), 60, "a new leader among the other two")
        zk.retry(zk.create, "/during", b"2")  # the session survives the move to another server
        assert zk.retry(zk.get, "/before")[0] == b"1"
        assert zk.retry(zk.get, "/during")[0] == b"2"
    finally:
        zk.stop()
        zk.close()

    ensemble.start_server(leader)
    restarted = client(ensemble.servers[leader].connect_string)  # this server alone
    try:
        restarted.sync("/during")
        assert restarted.get("/during")[0] == b"2"
    finally:
        restarted.stop()
        restarted.close()

    others = [i for i in range(len(ensemble.servers)) if i != leader]
    for index in others:  # no majority left: the restarted server stops serving
        ensemble.stop_server(index)
    wait_until(lambda: ensemble.servers[leader].mode is None, 60, "the lone server to stop serving")
