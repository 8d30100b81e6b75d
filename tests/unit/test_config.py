from pathlib import Path

import pytest

from broker.server.config import BrokerConfig, ConfigError, parse_overrides, read_properties


def base(**extra):
    return {"broker.id": "1", "zookeeper.connect": "127.0.0.1:2181", **extra}


def test_defaults_follow_the_design():
    config = BrokerConfig.from_settings(base())
    assert config.log_segment_bytes == 1 << 30
    assert config.log_retention_ms == 7 * 24 * 3600 * 1000
    assert config.log_retention_bytes == -1


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_settings({"port": "http", "colour": "blue", "log.flush.interval.ms": "0"})
    text = str(info.value)
    for expected in ("port='http'", "unknown setting 'colour'", "broker.id", "zookeeper.connect is required"[:17],
                     "log.flush.interval.ms=0 must be > 0"):
        assert expected in text


def test_log_dir_alias_and_several_dirs():
    config = BrokerConfig.from_settings(base(**{"log.dir": "/a, /b"}))
    assert config.log_dirs == (Path("/a"), Path("/b"))


def test_booleans_are_parsed_strictly():
    assert BrokerConfig.from_settings(base(**{"auto.create.topics": "off"})).auto_create_topics is False
    with pytest.raises(ConfigError, match="expected true or false"):
        BrokerConfig.from_settings(base(**{"auto.create.topics": "maybe"}))


def test_properties_file_with_comments(tmp_path):
    path = tmp_path / "broker.properties"
    path.write_text("# a comment\n! another\nbroker.id = 3\nport: 9999\n\n")
    assert read_properties(path) == {"broker.id": "3", "port": "9999"}


def test_properties_file_errors_name_the_line(tmp_path):
    path = tmp_path / "broker.properties"
    path.write_text("broker.id=1\nnonsense\n")
    with pytest.raises(ConfigError, match=r"broker.properties:2"):
        read_properties(path)
    with pytest.raises(ConfigError, match="cannot read"):
        read_properties(tmp_path / "missing.properties")


def test_overrides_need_key_value():
    assert parse_overrides(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["novalue"])


def test_example_configuration_file_is_valid():
    example = Path(__file__).resolve().parents[2] / "config" / "broker.properties"
    config = BrokerConfig.from_settings({**read_properties(example), "broker.id": "0"})
    assert config.zookeeper_connect.endswith("/logbus")
    assert config.default_replication_factor == 2  # the examples run two brokers: a stopped one is no outage


def test_retention_overrides_per_topic():
    from broker.server.broker import log_config

    config = BrokerConfig.from_settings(base(**{
        "log.retention.bytes": "1000000", "log.retention.bytes.per.topic": "_logbus_monitoring:-1, clicks:5000",
        "log.retention.ms.per.topic": "clicks:60000",
    }))
    assert log_config(config, "_logbus_monitoring").retention_bytes == -1
    assert (log_config(config, "clicks").retention_bytes, log_config(config, "clicks").retention_ms) == (5000, 60000)
    assert log_config(config, "other").retention_bytes == 1_000_000


def test_bad_per_topic_overrides_are_named():
    with pytest.raises(ConfigError, match="expected topic:value"):
        BrokerConfig.from_settings(base(**{"log.retention.ms.per.topic": "clicks"}))
    with pytest.raises(ConfigError, match="invalid topic name"):
        BrokerConfig.from_settings(base(**{"log.retention.ms.per.topic": "a b:5"}))
    with pytest.raises(ConfigError, match="values must be > 0"):
        BrokerConfig.from_settings(base(**{"log.retention.bytes.per.topic": "clicks:0"}))


def secrets_file(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "secrets.properties"
    path.write_text("zookeeper.auth=logbus:zk-secret\ninter.broker.sasl.password=broker-secret\n")
    path.chmod(mode)
    return path


def test_a_file_with_passwords_that_every_local_user_may_read_is_refused(tmp_path):
    path = secrets_file(tmp_path, 0o644)
    with pytest.raises(ConfigError) as refused:
        read_properties(path)
    assert f"chmod 600 {path}" in str(refused.value) and "inter.broker.sasl.password, zookeeper.auth" in str(refused.value)
    assert "secret" not in str(refused.value).replace("secrets.properties", "")


def test_a_file_with_passwords_its_group_may_read_is_read_with_a_warning(tmp_path, caplog):
    assert read_properties(secrets_file(tmp_path, 0o640))["zookeeper.auth"] == "logbus:zk-secret"
    assert "its group may read it (mode 0640)" in caplog.text
    caplog.clear()
    assert read_properties(secrets_file(tmp_path, 0o600))["inter.broker.sasl.password"] == "broker-secret"
    assert not caplog.text


def test_a_file_without_passwords_may_be_read_by_anyone(tmp_path):
    path = tmp_path / "broker.properties"
    path.write_text("port=9999\n")
    path.chmod(0o644)
    assert read_properties(path) == {"port": "9999"}


def test_config_files_are_read_in_order_and_a_password_on_the_command_line_is_warned_about(tmp_path, caplog):
    from broker.tools.cli import broker_arguments, load_config

    main = tmp_path / "broker.properties"
    main.write_text("broker.id=1\nzookeeper.connect=127.0.0.1:2181\nport=9999\n")
    config = load_config(broker_arguments().parse_args(
        ["--config", str(main), "--config", str(secrets_file(tmp_path, 0o600)), "--set", "port=9998"]))
    assert (config.zookeeper_auth, config.port) == ("logbus:zk-secret", 9998)
    assert not caplog.text
    load_config(broker_arguments().parse_args(["--config", str(main), "--set", "zookeeper.auth=logbus:zk-secret"]))
    assert "zookeeper.auth is on the command line" in caplog.text and "zk-secret" not in caplog.text


def test_frames_before_authentication_have_a_small_bound():
    assert BrokerConfig.from_settings(base()).sasl_server_max_receive_size == 64 * 1024
    with pytest.raises(ConfigError, match="sasl.server.max.receive.size=1048576 must be between 1024 and 131072"):
        BrokerConfig.from_settings(base(**{"sasl.server.max.receive.size": str(1 << 20)}))
