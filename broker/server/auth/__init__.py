"""Who may connect and what they may do (docs/operations.md, "Securing a cluster"):
listeners (`listeners`), TLS (`tls`), the SASL/SCRAM handshake (`sasl`), a connection's
authenticated identity (`session`), ACLs (`authorizer`) and what each request needs
(`rules`), and how this broker reaches the others (`interbroker`). ZooKeeper
credentials and node ACLs are `broker.common.zkauth`, shared with the `logbus`
command."""
