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
