"""`logbus-broker` as operators run it."""

import subprocess

from harness.cluster import broker_command

from .brokerutil import connect, produce


def run_broker(*args, timeout=60):
    return subprocess.run(broker_command() + list(args), capture_output=True, text=True, timeout=timeout)


def test_bad_configuration_fails_at_start_with_a_clear_message(tmp_path):
    result = run_broker("--broker-id", "1", "--zookeeper", "127.0.0.1:1", "--log-dir", str(tmp_path),
                        "--set", "log.segment.bytes=tiny", "--set", "no.such.key=1")
    assert result.returncode == 2
    assert "log.segment.bytes='tiny'" in result.stderr
    assert "unknown setting 'no.such.key'" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_required_settings_are_named(tmp_path):
    result = run_broker("--log-dir", str(tmp_path))
    assert result.returncode == 2
    assert "broker.id" in result.stderr and "zookeeper.connect" in result.stderr


def test_config_file_and_flags_combine(tmp_path, cluster):
    properties = tmp_path / "broker.properties"
    properties.write_text("num.partitions=3\nlog.flush.interval.ms=20\n")
    broker = cluster.start_broker(0, {})
    broker.stop()
    broker.settings = {}
    broker.command = lambda: broker_command() + [  # the file plus flags that override it
        "--config", str(properties), "--broker-id", "0", "--host", "127.0.0.1", "--port", str(broker.port),
        "--zookeeper", cluster.zookeeper, "--log-dir", str(tmp_path / "a"), "--log-dir", str(tmp_path / "b"),
    ]
    broker.start()
    with connect(broker) as conn:
        produce(conn, "fromfile", -1, [b"x"])
        assert len(conn.metadata(["fromfile"]).topics[0].partitions) == 3
    placed = [len(list((tmp_path / d).glob("fromfile-*"))) for d in ("a", "b")]
    assert sorted(placed) == [1, 2]  # spread over both log directories


def test_unreachable_zookeeper_fails_with_one_line(tmp_path):
    result = run_broker("--broker-id", "1", "--zookeeper", "127.0.0.1:1", "--log-dir", str(tmp_path),
                        "--set", "zookeeper.connection.timeout.ms=1000")
    assert result.returncode == 1
    assert "logbus-broker: cannot reach ZooKeeper at 127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_broker_on_a_new_chroot_creates_it_without_kazoo_s_warning(tmp_path, zookeeper):
    """Issue 39: every first start of a cluster logged kazoo's `No chroot path exists`
    although the broker creates its chroot itself."""
    from harness.cluster import LocalCluster

    cluster = LocalCluster(f"{zookeeper.connect_string}/new-{tmp_path.name[-12:]}", tmp_path)
    try:
        broker = cluster.start_broker(0, {})
        with connect(broker) as conn:
            produce(conn, "first", -1, [b"x"])  # the cluster works under the chroot it made
        assert "No chroot path exists" not in broker.log_path.read_text()
    finally:
        cluster.stop()
