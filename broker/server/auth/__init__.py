"""Who may connect and what they may do (docs/operations.md, "Securing a cluster"):
listeners and TLS (`listeners`, `tls`), the SASL/SCRAM handshake (`sasl`), a
connection's authenticated identity (`session`), ACLs (`authorizer`) and the broker's
ZooKeeper credentials and node ACLs are `broker.common.zkauth`, shared with the
`logbus` command."""
