"""The entry points (docs/architecture.md, "Layers"): `logbus-broker` starts the
server; the `logbus` command's subcommands reach the cluster through the client
library."""
