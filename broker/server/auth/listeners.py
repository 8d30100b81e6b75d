"""The broker's listeners, resolved from its settings (`listeners`,
`advertised.listeners`, `listener.security.protocol.map`, `inter.broker.listener.name`),
and the checks that refuse an inconsistent security configuration at start."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.common.listeners import Endpoint, SecurityProtocol, parse_endpoints, parse_protocol_map
from broker.server.config import BrokerConfig


@dataclass(frozen=True)
class Listener:
    name: str
    protocol: SecurityProtocol
    bind: Endpoint  # where the broker listens
    advertised: Endpoint  # what clients and other brokers are told
    kafka: bool = False  # speaks Kafka's protocol (`kafka.listener.names`), not logbus's


def listeners(config: BrokerConfig) -> list[Listener]:
    """The listeners to serve, in the order configured. Without `listeners`, one
    PLAINTEXT listener at `host`:`port` (what a broker did before listeners)."""
    bound = parse_endpoints(config.listeners) or (Endpoint("PLAINTEXT", config.host, config.port),)
    advertised = {e.name: e for e in parse_endpoints(config.advertised_listeners)}
    protocols = parse_protocol_map(config.listener_security_protocol_map)
    out = []
    for endpoint in bound:
        shown = advertised.get(endpoint.name) or Endpoint(endpoint.name, endpoint.host or config.host, endpoint.port)
        out.append(Listener(endpoint.name, protocols[endpoint.name], endpoint, shown,
                            endpoint.name in kafka_listener_names(config)))
    return out


def kafka_listener_names(config: BrokerConfig) -> set[str]:
    return {n.strip().upper() for n in config.kafka_listener_names.split(",") if n.strip()}


def inter_broker_listener(config: BrokerConfig) -> Listener:
    """The listener brokers reach each other on: named by `inter.broker.listener.name`,
    else the first one."""
    served = listeners(config)
    if not config.inter_broker_listener_name:
        return next((l for l in served if not l.kafka), served[0])
    return next(l for l in served if l.name == config.inter_broker_listener_name.upper())


def check_security(config: BrokerConfig) -> list[str]:
    """Every inconsistency of the security settings, worded for the operator."""
    try:
        bound = parse_endpoints(config.listeners)
        advertised = parse_endpoints(config.advertised_listeners)
        protocols = parse_protocol_map(config.listener_security_protocol_map)
    except ValueError as exc:
        return [str(exc)]
    problems = []
    names = [e.name for e in bound] or ["PLAINTEXT"]
    for name in names:
        if name not in protocols:
            problems.append(f"listener {name} has no security protocol in listener.security.protocol.map")
    for endpoint in advertised:
        if endpoint.name not in names:
            problems.append(f"advertised.listeners names {endpoint.name}, which is not in listeners")
        elif not endpoint.host or endpoint.port == 0:
            problems.append(f"advertised listener {endpoint} needs a host and a port clients can reach")
    if config.inter_broker_listener_name and config.inter_broker_listener_name.upper() not in names:
        problems.append(f"inter.broker.listener.name={config.inter_broker_listener_name} is not in listeners")
    native = [n for n in names if n not in kafka_listener_names(config)]
    if not native:
        problems.append("every listener speaks Kafka's protocol (kafka.listener.names): brokers and logbus clients "
                        "need one native listener")
    elif config.inter_broker_listener_name.upper() in kafka_listener_names(config):
        problems.append(f"inter.broker.listener.name={config.inter_broker_listener_name} speaks Kafka's protocol; "
                        "brokers replicate over a native listener")
    if problems:
        return problems
    served = listeners(config)
    if any(l.protocol.tls for l in served):
        for key, value in (("ssl.certfile", config.ssl_certfile), ("ssl.keyfile", config.ssl_keyfile)):
            if not value:
                problems.append(f"a TLS listener needs {key}")
            elif not Path(value).is_file():
                problems.append(f"{key}={value!r}: no such file")
    if config.ssl_cafile and not Path(config.ssl_cafile).is_file():
        problems.append(f"ssl.cafile={config.ssl_cafile!r}: no such file")
    if config.ssl_client_auth != "none" and not config.ssl_cafile:
        problems.append(f"ssl.client.auth={config.ssl_client_auth} needs ssl.cafile (the CA of client certificates)")
    inter = inter_broker_listener(config)
    if inter.protocol.sasl and not (config.inter_broker_sasl_username and config.inter_broker_sasl_password):
        problems.append(f"the inter-broker listener {inter.name} is {inter.protocol.value}: set "
                        "inter.broker.sasl.username and inter.broker.sasl.password")
    if inter.protocol.tls and not config.ssl_cafile:
        problems.append(f"the inter-broker listener {inter.name} is {inter.protocol.value}: set ssl.cafile so "
                        "brokers can verify each other")
    for key, value in (("zookeeper.ssl.cafile", config.zookeeper_ssl_cafile),
                       ("zookeeper.ssl.certfile", config.zookeeper_ssl_certfile),
                       ("zookeeper.ssl.keyfile", config.zookeeper_ssl_keyfile)):
        if value and not Path(value).is_file():
            problems.append(f"{key}={value!r}: no such file")
    if config.zookeeper_ssl_certfile and not config.zookeeper_ssl_cafile:
        problems.append("zookeeper.ssl.certfile needs zookeeper.ssl.cafile (TLS to ZooKeeper)")
    if config.zookeeper_set_acl and not config.zookeeper_auth:
        problems.append("zookeeper.set.acl needs zookeeper.auth (user:password of the brokers' digest)")
    return problems


def broker_principal(config: BrokerConfig) -> str:
    """Who this broker authenticates as on the inter-broker listener, registered in
    ZooKeeper so that leaders can check a follower's fetch comes from that broker:
    `broker.principal`, else its SCRAM user, else its certificate's subject."""
    if config.broker_principal:
        return config.broker_principal
    inter = inter_broker_listener(config)
    if inter.protocol.sasl:
        return f"User:{config.inter_broker_sasl_username}"
    if inter.protocol.tls:
        from broker.server.auth.tls import certificate_principal

        return certificate_principal(config.ssl_certfile)
    return ""
