"""The schema registry (docs/schemas.md): the subset of Confluent Schema Registry's REST
API that Kafka clients use, served by `logbus schema-registry` processes that keep
every schema, id, version and setting in ZooKeeper, so any number of them answer
alike. Imports only broker/common (docs/architecture.md, "Layers")."""
