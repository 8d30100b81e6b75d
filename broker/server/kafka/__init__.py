"""The Kafka protocol's front end (docs/kafka.md): its connection, its handlers and the
group coordinator, over the same logs, replication and authorizer as the native
listeners. The codecs are `broker.common.kafka`'s."""
